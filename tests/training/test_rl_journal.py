"""The RL journal: a run whose checkpoints are gone (a new machine, only the committed logs) is
rebuilt by replaying its journaled updates without one rollout, bit for bit, and goes on to the
same weights and log as a run that was never interrupted; a journal that does not reproduce
stops the resume."""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("datasets") is None,
    reason="needs torch and datasets (the train extra)",
)

TIMING = {"rollout_seconds", "rollout_tokens_per_s", "step_seconds", "train_tokens_per_s"}


@pytest.fixture(autouse=True)
def _threads() -> None:
    import torch

    torch.set_num_threads(2)


def _config(out: Path, steps: int, **changes: Any) -> Any:
    from tapekit.training.rl import RLRunConfig

    sampled = {"tasks_per_step": 3, "group_size": 4, "max_tokens": 12, "max_loops": 2}
    values = {"output_dir": str(out), "steps": steps, "learning_rate": 3e-3, "seed": 1, "journal": True}
    return RLRunConfig(**{**values, "rollouts": sampled, **changes})


def _counting_setup(calls: list[int]) -> Any:
    """The toy setup, counting the agents it builds (one per round of rollouts)."""
    from tests.training.rl_toy import make_setup

    setup = make_setup()

    def agent_for(llm: Any) -> Any:
        calls.append(1)
        return setup.agent_for(llm)

    return replace(setup, agent_for=agent_for)


def _lines(out: Path) -> list[dict[str, Any]]:
    lines = (out / "rl_log.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines]


def _lose_the_machine(out: Path) -> None:
    """What a new checkout has of a run: its committed logs and journal, nothing else."""
    for path in out.iterdir():
        if path.name not in {"journal", "rl_log.jsonl"}:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _same_weights(a: Any, b: Any) -> bool:
    import torch

    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_a_run_rebuilt_from_its_journal_alone_replays_without_rollouts_and_goes_on_exactly(
    tmp_path: Path,
) -> None:
    from tapekit.training.rl import train_rl
    from tapekit.training.rl._journal import read_entry
    from tests.training.rl_toy import make_model

    calls: list[int] = []
    whole_model, tokenizer = make_model()
    train_rl(_counting_setup(calls), whole_model, tokenizer, _config(tmp_path / "whole", 4))
    assert len(calls) == 4  # one round of rollouts a step

    out = tmp_path / "lost"
    model, tokenizer = make_model()
    train_rl(_counting_setup(calls), model, tokenizer, _config(out, 2))
    journal = sorted((out / "journal").iterdir())
    assert [p.name for p in journal] == ["step-000001.json.gz", "step-000002.json.gz"]
    entry = read_entry(journal[0])
    assert entry.rows and all(set(r) >= {"input_ids", "loss_mask", "logprobs", "reward"} for r in entry.rows)
    assert entry.record["step"] == 0 and len(entry.weights) == 16
    assert sum(p.stat().st_size for p in journal) < 200_000  # small enough to commit

    _lose_the_machine(out)
    calls.clear()
    model, tokenizer = make_model()  # the same initial model, rebuilt
    result = train_rl(
        _counting_setup(calls), model, tokenizer, _config(out, 4).model_copy(update={"resume": True})
    )
    assert len(calls) == 2  # steps 0-1 replayed with no rollout, steps 2-3 rolled out
    assert [r.step for r in result.history] == [1, 2, 3, 4]
    assert _lines(out) == _lines(tmp_path / "whole")  # the same log as the unbroken run
    assert _same_weights(model, whole_model)  # and the same weights, bit for bit
    assert (out / "latest.json").exists()

    calls.clear()  # a resume of a finished run replays nothing and rolls out nothing
    again, tokenizer = make_model()
    done = train_rl(
        _counting_setup(calls), again, tokenizer, _config(out, 4).model_copy(update={"resume": True})
    )
    assert not calls and len(done.history) == 4 and _same_weights(again, whole_model)


def test_replay_starts_from_the_newest_checkpoint_and_only_applies_later_entries(tmp_path: Path) -> None:
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_model

    calls: list[int] = []
    whole, tokenizer = make_model()
    train_rl(_counting_setup(calls), whole, tokenizer, _config(tmp_path / "whole", 3))
    out = tmp_path / "run"
    model, tokenizer = make_model()
    train_rl(_counting_setup(calls), model, tokenizer, _config(out, 1))  # checkpoint 1
    saved = out / "ckpt-000001"
    kept = tmp_path / "ckpt-000001"
    shutil.copytree(saved, kept)  # keep step 1's checkpoint, as a machine that died later would
    latest = (out / "latest.json").read_text()
    model, tokenizer = make_model()
    train_rl(_counting_setup(calls), model, tokenizer, _config(out, 3).model_copy(update={"resume": True}))
    shutil.rmtree(out / "ckpt-000003")
    shutil.copytree(kept, saved)
    (out / "latest.json").write_text(latest)  # the machine kept checkpoint 1 and the journal
    (out / "journal" / "step-000001.json.gz").unlink()  # step 1 can only come from the checkpoint
    calls.clear()
    model, tokenizer = make_model()
    result = train_rl(
        _counting_setup(calls), model, tokenizer, _config(out, 3).model_copy(update={"resume": True})
    )
    assert not calls and len(result.history) == 3  # steps 2-3 replayed on top of checkpoint 1
    assert _same_weights(model, whole)


def test_a_journal_that_does_not_reproduce_stops_the_resume_and_says_where(tmp_path: Path) -> None:
    import torch

    from tapekit.errors import TrainingError
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_model

    out = tmp_path / "run"
    model, tokenizer = make_model()
    train_rl(_counting_setup([]), model, tokenizer, _config(out, 2))
    _lose_the_machine(out)
    other, tokenizer = make_model()
    with torch.no_grad():  # another initial model than the run's
        next(other.parameters()).add_(1e-3)
    with pytest.raises(TrainingError, match=r"journal step 1 .* does not reproduce.*step-000001"):
        train_rl(_counting_setup([]), other, tokenizer, _config(out, 2).model_copy(update={"resume": True}))


def test_journal_is_refused_with_several_processes() -> None:
    from tapekit.errors import TrainingError
    from tapekit.training.rl._dist import RLDist

    with pytest.raises(TrainingError, match="journal runs in one process only"):
        RLDist(rank=0, world=2).check(_config(Path("unused"), 1))


def test_a_peft_model_passed_in_trains_its_adapter_and_replays_from_the_journal(tmp_path: Path) -> None:
    """The plateau study's arms: a new LoRA adapter put on the branch point by the caller
    (``lora`` None), trained, and rebuilt on a new machine from the journal alone."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_model

    def adapted() -> tuple[Any, Any]:
        model, tokenizer = make_model()
        torch.manual_seed(7)  # the adapter's initial weights, drawn the same way each time
        return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")), tokenizer

    calls: list[int] = []
    whole, tokenizer = adapted()
    base = {n: p.detach().clone() for n, p in whole.named_parameters() if "lora_" not in n}
    train_rl(_counting_setup(calls), whole, tokenizer, _config(tmp_path / "whole", 3, lora=None))
    assert all(torch.equal(p, base[n]) for n, p in whole.named_parameters() if n in base)  # base frozen
    assert any(p.abs().sum() > 0 for n, p in whole.named_parameters() if "lora_B" in n)  # adapter trained

    out = tmp_path / "lost"
    model, tokenizer = adapted()
    train_rl(_counting_setup(calls), model, tokenizer, _config(out, 2, lora=None))
    _lose_the_machine(out)
    calls.clear()
    model, tokenizer = adapted()
    resumed = _config(out, 3, lora=None).model_copy(update={"resume": True})
    train_rl(_counting_setup(calls), model, tokenizer, resumed)
    assert len(calls) == 1  # two updates replayed, one rolled out
    assert _lines(out) == _lines(tmp_path / "whole") and _same_weights(model, whole)
