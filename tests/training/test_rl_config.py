"""RL as a config/trainer pair: :class:`RLRunConfig` extends ``TrainConfig`` with the sections
``grpo``, ``rollouts`` and ``curriculum``, each field defined once; a config in the old flat
shape loads to the same settings with a warning; one typed step record, written to
``rl_log.jsonl`` as every log so far; the moved modules' shims; and the package's shape (no
module over 600 lines, no class over 400, no import circle). No torch needed."""

from __future__ import annotations

import ast
import importlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from tapekit.training.config import TrainConfig, load_config
from tapekit.training.rl import (
    CurriculumConfig,
    GRPOConfig,
    RLConfig,
    RLRunConfig,
    RLStepRecord,
    RolloutConfig,
)
from tapekit.training.rl._config import MOVED, _StepKnobs

ROOT = Path(__file__).resolve().parents[2]

# every key of the old flat shape, with a value other than its default, and where it went
OLD_FLAT: dict[str, Any] = {
    "clip_low": 0.1,
    "clip_high": 0.3,
    "kl_coef": 0.05,
    "scale_rewards": False,
    "aggregation": "constant",
    "micro_batch_size": 4,
    "negative_scale": 0.5,
    "share_prefix": False,
    "ppo_epochs": 2,
    "minibatches": 3,
    "tasks_per_step": 16,
    "group_size": 4,
    "temperature": 0.7,
    "max_tokens": 48,
    "max_loops": None,
    "resample_rounds": 2,
    "rollout_engine": "llamacpp",
    "rollout_gguf": "base.gguf",
    "rollout_threads": 2,
    "rollout_servers": ["http://a:8000/v1"],
    "served_model": "base",
    "adapter_dir": "/shared/adapters",
    "lora_name_prefix": "toy",
    "rollout_logprobs": "processed",
    "curriculum": "fixed",
    "sec_alpha": 0.3,
    "sec_temperature": 0.5,
    "fixed_order": ["b", "a"],
    "steps_per_category": 2,
}
STAYED: dict[str, Any] = {  # the run's own fields and TrainConfig's: where they were
    "setup": "tests.training.rl_toy:make_setup",
    "setup_args": {"reward": "steps"},
    "run_name": "toy",
    "steps": 7,
    "mode": "async",
    "max_staleness": 2,
    "checkpoint": False,
    "learning_rate": 3e-3,
    "weight_decay": 0.01,
    "max_grad_norm": 0.5,
    "seed": 5,
    "resume": True,
    "device": "auto",
    "report_to": ["tensorboard"],
    "lora": {"r": 4, "alpha": 8},
}


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        section, name = MOVED[key]
        out.setdefault(section, {})[name] = value
    return out


def test_every_old_flat_key_has_a_new_place_and_the_table_covers_the_old_shape() -> None:
    assert set(OLD_FLAT) == set(MOVED)
    sections = {"grpo": GRPOConfig, "rollouts": RolloutConfig, "curriculum": CurriculumConfig}
    for old, (section, name) in MOVED.items():
        assert name in sections[section].model_fields, old


def test_an_old_flat_config_file_loads_with_a_warning_to_the_nested_ones_settings(tmp_path: Path) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(yaml.safe_dump({**STAYED, **OLD_FLAT, "model": "student"}))
    new.write_text(yaml.safe_dump({**STAYED, **_nested(OLD_FLAT), "model": "student"}))
    with pytest.warns(DeprecationWarning) as caught:
        loaded_old = load_config(RLRunConfig, old)
    message = str(caught[0].message)
    assert "clip_low -> grpo.clip_low" in message and "rollout_servers -> rollouts.servers" in message
    assert "curriculum -> curriculum.kind" in message and "sec_alpha -> curriculum.sec_alpha" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the nested shape warns of nothing
        loaded_new = load_config(RLRunConfig, new)
    assert loaded_old == loaded_new
    assert loaded_new.model == str(tmp_path / "student")  # relative to the file, as for SFT/DPO
    assert loaded_new.grpo.clip_low == 0.1 and loaded_new.rollouts.servers == ["http://a:8000/v1"]
    assert loaded_new.curriculum.kind == "fixed" and loaded_new.rollouts.max_loops is None
    assert loaded_new.lora is not None and loaded_new.lora.r == 4 and loaded_new.learning_rate == 3e-3


def test_command_line_overrides_of_old_keys_land_in_a_nested_file(tmp_path: Path) -> None:
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump({"rollouts": {"group_size": 4}, "grpo": {"clip_low": 0.1}}))
    with pytest.warns(DeprecationWarning, match="tasks_per_step -> rollouts.tasks_per_step"):
        config = load_config(RLRunConfig, path, {"tasks_per_step": 2})  # --set tasks_per_step=2
    assert (config.rollouts.tasks_per_step, config.rollouts.group_size) == (2, 4)
    config = load_config(RLRunConfig, path, {"rollouts": {"tasks_per_step": 2}})  # the nested --set
    assert (config.rollouts.tasks_per_step, config.rollouts.group_size) == (2, 4)
    with pytest.warns(DeprecationWarning):  # an old keyword beside a section given as a model
        config = RLRunConfig(rollouts=RolloutConfig(group_size=4), tasks_per_step=2)  # type: ignore[call-arg]
    assert (config.rollouts.tasks_per_step, config.rollouts.group_size) == (2, 4)


def test_a_wrong_key_is_an_error_that_names_it() -> None:
    with pytest.raises(ValueError, match="group_sizes"):
        load_config(RLRunConfig, overrides={"group_sizes": 4})
    with pytest.raises(ValueError, match=r"rollouts\.group_sizes"):
        load_config(RLRunConfig, overrides={"rollouts": {"group_sizes": 4}})
    with pytest.raises(ValueError, match=r"group_size \(the old flat shape\) and rollouts\.group_size"):
        RLRunConfig(group_size=4, rollouts={"group_size": 8})  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"max_steps is not used by RL \(RL runs `steps` RL steps"):
        RLRunConfig(max_steps=10)
    with pytest.raises(ValueError, match="dataset is not used by RL"):
        load_config(RLRunConfig, overrides={"dataset": "samples.parquet"})
    with pytest.raises(ValueError, match="resume is true or false"):
        RLRunConfig(resume="ckpt-000003")
    with pytest.raises(ValueError, match="gguf_quantization"):
        RolloutConfig(engine="llamacpp", gguf_quantization="q4_1")  # type: ignore[arg-type]


def test_a_llamacpp_policy_refuses_a_quantization_it_cannot_write(tmp_path: Path) -> None:
    from tapekit.errors import TrainingError
    from tapekit.training.rl._policies import LlamaCppPolicy

    with pytest.raises(TrainingError, match="quantization 'q4_1' is not q8_0, f16 or f32"):
        LlamaCppPolicy(None, tmp_path, temperature=1.0, max_tokens=8, quantization="q4_1")  # type: ignore[arg-type]


def test_rl_keeps_its_defaults_and_restates_no_field_of_another_config() -> None:
    config = RLRunConfig()
    assert (config.output_dir, config.lora, config.learning_rate) == ("tapekit-rl", None, 1e-4)
    assert config.device == "cpu"
    assert (config.steps, config.rollouts.tasks_per_step, config.rollouts.group_size) == (20, 8, 8)
    assert (config.curriculum.kind, config.grpo.clip_low, config.rollouts.temperature) == ("sec", 0.2, 1.0)
    assert RLRunConfig.model_validate(config.model_dump()) == config  # the dump loads back
    assert RLRunConfig(lora={"r": 8}).lora is not None
    # each field is defined in one class only: the run's tree, TrainConfig and the per-step view
    classes = [TrainConfig, RLRunConfig, GRPOConfig, _StepKnobs, RolloutConfig, CurriculumConfig, RLConfig]
    owners: dict[str, list[str]] = {}
    for cls in classes:
        for name in cls.__annotations__:
            owners.setdefault(name, []).append(cls.__name__)
    restated = {name: owner for name, owner in owners.items() if len(owner) > 1}
    # the per-step view holds what the loop fills in from the sections and TrainConfig
    assert restated == {
        "temperature": ["RolloutConfig", "RLConfig"],
        "max_tokens": ["RolloutConfig", "RLConfig"],
        "max_grad_norm": ["TrainConfig", "RLConfig"],
        "group_key": ["GRPOConfig", "RLConfig"],  # the run's choice (task_id/category); any column per step
    }
    own = set(RLRunConfig.__annotations__)
    assert own == {"setup", "setup_args", "run_name", "steps", "mode", "max_staleness", "checkpoint"} | {
        "journal",
        "release_freed_memory",
        "grpo",
        "rollouts",
        "curriculum",
    }


def test_each_grpo_step_reads_the_sections() -> None:
    config = RLRunConfig(
        max_grad_norm=0.5,
        grpo={"clip_low": 0.1, "aggregation": "constant", "ppo_epochs": 3},
        rollouts={"temperature": 0.7, "max_tokens": 48},
    )
    step = config.step_config(pad_id=5)
    assert step == RLConfig(
        clip_low=0.1, aggregation="constant", temperature=0.7, max_tokens=48, max_grad_norm=0.5, pad_id=5
    )
    assert RLRunConfig().step_config(0).max_tokens is None  # only Dr. GRPO's normaliser needs it
    with pytest.raises(ValueError, match="needs max_tokens"):
        RLConfig(aggregation="constant")
    with pytest.raises(ValueError, match="frozen"):
        step.clip_low = 0.3  # type: ignore[misc]


def test_old_flat_names_still_read_with_a_warning() -> None:
    config = RLRunConfig(rollouts={"group_size": 4}, curriculum={"kind": "uniform", "sec_alpha": 0.3})
    with pytest.warns(DeprecationWarning, match=r"group_size is deprecated: read RLRunConfig.rollouts"):
        assert config.group_size == 4  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="curriculum.sec_alpha"):
        assert config.sec_alpha == 0.3  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        config.group_sizes  # type: ignore[attr-defined]  # noqa: B018


def _record(**changes: Any) -> RLStepRecord:
    values: dict[str, Any] = {
        "trainer": "rl", "step": 3, "seconds": 9.0, "step_seconds": 2.5, "loss": 0.25, "reward": 0.5,
        "tokens": 40, "policy_version": 2, "rollout_version": 1, "policy_lag": 1, "reward_std": 0.5,
        "scores": {"strict": 0.25, "lenient": None}, "scored_rollouts": 8, "zero_adv_share": 0.5,
        "groups": 2, "rollout_seconds": 1.5, "rollout_tokens_per_s": 80.0, "rollouts": 8,
        "rollout_prompt_tokens": 400, "rollout_output_tokens": 120, "sampler_values": {"a": 0.1},
        "sampler_probs": {"a": 1.0}, "categories": {"a": 2}, "clip_fraction": 0.1, "ratio_mean": 0.99,
        "kl": 0.01, "train_tokens_per_s": 300.0, "grad_norm": 0.7, "train_input_tokens": 520,
    }  # fmt: skip
    return RLStepRecord(**{**values, **changes})


def test_the_step_record_is_written_as_every_log_line_so_far() -> None:
    record = _record()
    assert list(record.to_log()) == [
        "step", "policy_version", "rollout_version", "policy_lag", "reward_mean", "reward_std",
        "score_strict", "score_lenient", "scored_rollouts", "zero_adv_share", "groups", "rollout_seconds",
        "rollout_tokens_per_s", "rollouts", "rollout_prompt_tokens", "rollout_output_tokens",
        "failed_rollouts", "environment_failures", "step_seconds", "sampler_values", "sampler_probs",
        "categories", "loss", "clip_fraction", "ratio_mean", "kl", "train_tokens", "train_tokens_per_s",
        "grad_norm", "train_input_tokens",
    ]  # fmt: skip
    line = record.to_log()
    assert (line["step"], line["reward_mean"], line["train_tokens"]) == (2, 0.5, 40)
    assert line["score_lenient"] is None
    assert RLStepRecord.from_log(line, seconds=9.0) == record
    idle = _record(grad_norm=None, processes=2).to_log()  # a step that trained nothing; two processes
    assert "grad_norm" not in idle and list(idle)[-1] == "processes" and idle["processes"] == 2
    by_task = _record(category_rewards={"a": 0.5}).to_log()  # written by runs since 2026-11-28
    assert list(by_task).index("category_rewards") == list(by_task).index("categories") + 1
    # a StepRecord like SFT's and DPO's: what the callbacks and the trackers read
    assert record.metrics == line and record.value("score_strict") == 0.25 and record.value("reward") == 0.5
    scalars = record.scalars()
    assert scalars["reward"] == scalars["reward_mean"] == 0.5 and scalars["sampler_probs/a"] == 1.0
    assert "step" not in scalars and "score_lenient" not in scalars  # None is no number
    with pytest.warns(DeprecationWarning, match=r"RLStepRecord\['reward_mean'\] is deprecated"):
        assert record["reward_mean"] == 0.5


def test_the_committed_experiment_logs_read_back_and_write_back_the_same_lines() -> None:
    logs = sorted((ROOT / "docs" / "experiments").rglob("rl_log.jsonl"))
    if not logs:
        pytest.skip("no committed rl_log.jsonl")
    current = set(_record().to_log())
    same = 0
    for path in logs:
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            record = RLStepRecord.from_log(line)  # every shape ever written reads back
            if {k for k in line if not k.startswith("score_")} >= current - {"score_strict", "score_lenient"}:
                assert json.dumps(record.to_log()) == raw, path  # today's shape: the same text
                same += 1
    assert same > 0


@pytest.mark.parametrize(
    "old, name",
    [
        ("tapekit.training.rl_loop", "train_rl"),
        ("tapekit.training.rollouts", "collect_rollouts"),
        ("tapekit.training.policies", "LocalPolicy"),
        ("tapekit.training.advantages", "group_advantages"),
        ("tapekit.training.grpo_loss", "policy_loss"),
        ("tapekit.training.tiny", "make_tiny"),
        ("tapekit.training._common", "PackedRowsCollator"),
    ],
)
def test_a_moved_module_still_imports_with_a_warning_naming_the_new_one(old: str, name: str) -> None:
    sys.modules.pop(old, None)
    new = "tapekit.testing.tiny" if old.endswith("tiny") else "tapekit.training"
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is _current(name)


def _current(name: str) -> Any:
    for home in ("tapekit.training.rl", "tapekit.testing.tiny", "tapekit.training._data"):
        found = getattr(importlib.import_module(home), name, None)
        if found is not None:
            return found
    raise AttributeError(name)


def test_training_error_is_tapekits_and_is_found_where_it_was() -> None:
    from tapekit.errors import TapekitError, TrainingError
    from tapekit.training import TrainingError as from_training

    assert from_training is TrainingError and issubclass(TrainingError, TapekitError | ValueError)


def _training_modules() -> list[Path]:
    return [*sorted((ROOT / "tapekit" / "training").rglob("*.py")), ROOT / "tapekit" / "testing" / "tiny.py"]


def test_no_training_module_is_over_600_lines_and_no_class_over_400() -> None:
    for path in _training_modules():
        text = path.read_text()
        assert text.count("\n") <= 600, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert (node.end_lineno or 0) - node.lineno + 1 <= 400, f"{path}: {node.name}"


def test_the_training_modules_import_no_circle() -> None:
    import grimp

    graph = grimp.build_graph("tapekit", exclude_type_checking_imports=True)
    training = {m for m in graph.modules if m.startswith("tapekit.training")}
    circles = [
        (a, b)
        for a in sorted(training)
        for b in graph.find_modules_directly_imported_by(a)
        if b in training and b != a and graph.chain_exists(importer=b, imported=a)
    ]
    assert circles == []
