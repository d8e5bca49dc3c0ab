"""``examples/web_agent/plateau.py``: the plateau rule, a resumed run's ledger and validation
points, a model swapped in whole even when killed, and test seeds no earlier study read. The
stages themselves run real Chromium and SmolLM2 for hours: docs/experiments/web-plateau.md is
their record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.examples._commands import missing_for_web

MISSING = missing_for_web(("trl", "trl"), ("llguidance", "llguidance"))
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}")


def _points(*values: float) -> list[dict[str, Any]]:
    return [{"step": 8 * i, "success": v} for i, v in enumerate(values)]


def test_the_plateau_is_three_evaluations_without_a_rise() -> None:
    from examples.web_agent.plateau import plateau_reached

    assert not plateau_reached([], 3)
    assert not plateau_reached(_points(0.2, 0.5, 0.5, 0.5), 3)  # 3 evaluations after the best, 2 of them ties
    assert plateau_reached(_points(0.2, 0.5, 0.5, 0.5, 0.4), 3)  # a tie is not a rise
    assert not plateau_reached(_points(0.2, 0.5, 0.4, 0.4, 0.6), 3)  # it rose again: wait on
    assert plateau_reached(_points(0.9, 0.1, 0.2, 0.3), 3)  # the first point was the best
    assert not plateau_reached(_points(0.2, 0.5, 0.4, 0.4), 3)


def test_the_fresh_test_seeds_are_in_the_split_and_after_the_first_forty() -> None:
    from examples.web_agent.plateau import TEST_SEEDS
    from tapekit.web.miniwob import SPLIT, split_of

    assert list(TEST_SEEDS) == list(range(200_040, 200_060))
    assert all(split_of("click-button", s) == "test" for s in TEST_SEEDS)
    assert all(split_of("click-dialog-2", s) == "held_out" for s in TEST_SEEDS)
    assert not set(TEST_SEEDS) & set(SPLIT.test_seeds[:40])  # what earlier studies evaluated


def test_a_resumed_run_drops_the_ledger_lines_after_its_checkpoint(tmp_path: Path) -> None:
    """Steps done after the last checkpoint are done again on resume: their charges go."""
    from examples.web_agent.plateau import run_ledger
    from examples.web_agent.study import Ledger

    class Model:
        def num_parameters(self) -> int:
            return 1000

    run = tmp_path / "grpo-seed0"
    run.mkdir()
    first = Ledger(run / "ledger.jsonl", 1000)
    for step in range(1, 6):
        first.add(f"grpo-seed0-{step}", 10.0, trained=100, rolled=50, episodes=4)
    (run / "ckpt-000003").mkdir()  # killed after step 5; the last checkpoint is step 3
    resumed = run_ledger(run / "ledger.jsonl", Model())
    assert [json.loads(x)["stage"] for x in (run / "ledger.jsonl").read_text().splitlines()] == [
        "grpo-seed0-1",
        "grpo-seed0-2",
        "grpo-seed0-3",
    ]
    assert resumed.seconds == 30.0 and resumed.episodes == 12
    assert resumed.flops == 3 * (6.0 * 1000 * 100 + 2.0 * 1000 * 50)
    resumed.add("grpo-seed0-4", 10.0, trained=100, rolled=50, episodes=4)
    assert resumed.seconds == 40.0  # counting goes on from the checkpoint
    (run / "ckpt-000003").rmdir()
    sft = tmp_path / "sft"
    sft.mkdir()
    assert run_ledger(sft / "ledger.jsonl", Model()).seconds == 0.0  # a new run


class _Model:
    def __init__(self, tag: str, fail: bool = False) -> None:
        self.tag, self.fail = tag, fail

    def save_pretrained(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps({"tag": self.tag}))
        if self.fail:
            raise KeyboardInterrupt  # killed before the weights were whole


class _Tokenizer:
    def save_pretrained(self, path: Path) -> None:
        (path / "tokenizer_config.json").write_text("{}")


def test_a_model_is_swapped_in_whole_or_not_at_all(tmp_path: Path) -> None:
    from examples.web_agent import plateau

    where = tmp_path / "plateau"
    plateau.save(_Model("a"), _Tokenizer(), where)
    assert plateau.ready(where) and json.loads((where / "config.json").read_text())["tag"] == "a"
    with pytest.raises(KeyboardInterrupt):  # killed while writing the next best
        plateau.save(_Model("b", fail=True), _Tokenizer(), where)
    assert plateau.ready(where) and json.loads((where / "config.json").read_text())["tag"] == "a"
    # killed between the renames: the new model is whole beside it, and ready() finishes the swap
    plateau.save(_Model("c"), _Tokenizer(), tmp_path / "c")
    shutil.rmtree(tmp_path / "plateau.part")  # what the next save does first
    (tmp_path / "c").rename(tmp_path / "plateau.part")
    where.rename(tmp_path / "plateau.old")
    assert plateau.ready(where) and json.loads((where / "config.json").read_text())["tag"] == "c"


class _Record:
    def __init__(self, step: int) -> None:
        self.step = step


def test_validation_points_are_neither_repeated_nor_skipped_on_resume(tmp_path: Path) -> None:
    from examples.web_agent.plateau import Evaluations, plateau_reached, read_lines

    path = tmp_path / "val.jsonl"
    scores = iter([0.1, 0.3, 0.3, 0.2, 0.25, 0.9])
    scored: list[int] = []

    def score(step: int) -> dict[str, float]:
        scored.append(step)
        return {"success": next(scores)}

    def evaluations() -> Evaluations:
        return Evaluations(
            path,
            lambda r: r.step % 8 == 0,
            score,
            then=lambda _: plateau_reached(read_lines(path), 3),
        )

    first = evaluations()
    for step in range(1, 20):  # killed after step 19 (the checkpoint was at 16)
        assert first.on_step(_Record(step)) is None  # type: ignore[arg-type]
    again = evaluations()
    stops = [step for step in range(17, 41) if again.on_step(_Record(step))]  # type: ignore[arg-type]
    assert scored == [8, 16, 24, 32, 40]
    assert stops == [40]  # 0.3 at 16, then 24, 32, 40 without a rise: the plateau
    assert [p["step"] for p in read_lines(path)] == [8, 16, 24, 32, 40]


def test_lora_is_the_default_and_rank_zero_is_the_first_runs_full_fine_tuning() -> None:
    from examples.web_agent.plateau import LORA_LR_GRID, LORA_SFT_LR, LR_GRID, SFT_LR, parse_args

    lora = parse_args(["sft"])
    assert (lora.lora_r, lora.sft_lr, lora.grid_lr) == (16, LORA_SFT_LR, list(LORA_LR_GRID))
    full = parse_args(["sft", "--lora-r", "0"])
    assert (full.sft_lr, full.grid_lr) == (SFT_LR, list(LR_GRID))
    assert parse_args(["sft", "--sft-lr", "1e-3"]).sft_lr == 1e-3
    with pytest.raises(SystemExit):
        parse_args(["sft", "--lora-r", "-1"])


def test_the_arms_budget_and_validations_are_checked() -> None:
    from examples.web_agent.plateau import parse_args

    args = parse_args(["arm"])
    assert (args.rl_steps, args.arm_evals) == (50, 2)  # the amended protocol: 25 and 50 updates
    for bad in (["--arm-evals", "0"], ["--rl-steps", "0"]):
        with pytest.raises(SystemExit):
            parse_args(["arm", *bad])


@pytest.mark.parametrize("lora", [True, False])
def test_git_keeps_the_logs_and_with_lora_the_adapters_to_test(tmp_path: Path, lora: bool) -> None:
    import subprocess

    from examples.web_agent.plateau import gitignore

    if shutil.which("git") is None:
        pytest.skip("needs git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(gitignore(lora=lora))
    paths = {
        "sft/val.jsonl": False,
        "grid/lr3e-05-t0.7/journal/step-000001.json.gz": False,
        "grid/lr3e-05-t0.7/val.jsonl": False,
        "tapes.db": True,
        "tapes.db-wal": True,
        "sft/checkpoint-8/optimizer.pt": True,
        "sft/final/adapter_model.safetensors": True,
        "grpo-seed0/ckpt-3/adapter_model.safetensors": True,
        "grpo-seed0/latest.json": True,
        "grid/lr3e-05-t0.7/final/adapter_model.safetensors": True,
        "grid/lr3e-05-t0.7/ckpt-2/adapter_model.safetensors": True,
        "plateau.part/adapter_model.safetensors": True,
        # the policies the test stage reads: committed with LoRA, too big without
        "plateau/adapter_model.safetensors": not lora,
        "grpo-seed0/final/adapter_model.safetensors": not lora,
        "sft-seed1/final/adapter_model.safetensors": not lora,
    }
    for path in paths:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    result = subprocess.run(
        ["git", "check-ignore", *paths], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    ignored = set(result.stdout.split())
    assert {path for path, is_ignored in paths.items() if is_ignored} == ignored


@pytest.mark.train
def test_the_plateau_adapter_is_saved_whole_and_loads_back_merged_with_an_arm_on_top(tmp_path: Path) -> None:
    """A LoRA plateau is an adapter directory (what is committed); the branch point is the base
    with it merged, and an arm's adapter goes on top of that: the logits match the models saved."""
    import torch

    from examples.web_agent import plateau
    from examples.web_agent.study import load_student

    args = plateau.parse_args(["sft", "--lora-r", "4"])
    ids = torch.tensor([[1, 2, 3, 4, 5]])

    def trained(model: Any, seed: int) -> Any:
        model = plateau.adapted(model, args, seed=seed)
        torch.manual_seed(seed)
        with torch.no_grad():  # LoRA's B starts at zero: move it, as training would
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.01 * torch.randn_like(p))
        return model.eval()

    base, tok = load_student()
    at_plateau = trained(base, 0)
    plateau.save(at_plateau, tok, tmp_path / plateau.PLATEAU)
    where = tmp_path / plateau.PLATEAU
    assert plateau.ready(where) and (where / "adapter_config.json").exists()
    assert (where / "adapter_model.safetensors").stat().st_size < 5_000_000  # rank 4: small
    branch, _ = plateau.load_branch(tmp_path)
    with torch.no_grad():
        expected = at_plateau(input_ids=ids).logits
        # merging rounds in fp32: logits of ~20 move by ~1e-4
        assert torch.allclose(branch(input_ids=ids).logits, expected, atol=1e-3)
        assert not hasattr(branch, "peft_config")  # merged: a plain model for the arms' new adapter
    arm = trained(branch, 1)
    plateau.save(arm, tok, tmp_path / "grpo-seed1" / "final")
    loaded, _ = plateau.load_policy(tmp_path, tmp_path / "grpo-seed1" / "final")
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, arm(input_ids=ids).logits, atol=1e-3)
        assert (loaded(input_ids=ids).logits - expected).abs().max() > 0.05  # the arm's adapter is on
    with pytest.raises(SystemExit, match="plateau's weights are not here"):
        plateau.load_branch(tmp_path / "elsewhere")


def test_teacher_samples_are_read_back_from_the_committed_file_without_tapes(tmp_path: Path) -> None:
    import gzip

    from examples.web_agent import plateau

    rows = [("sft", [1, 2, 3], [0, 1, 1]), ("fresh", [4, 5], [0, 1]), ("sft", [6, 7], [1, 1])]
    with gzip.open(tmp_path / plateau.SAMPLES, "wt") as f:
        for pool, ids, mask in rows:
            f.write(json.dumps({"pool": pool, "input_ids": ids, "loss_mask": mask}) + "\n")
    got = plateau.teacher_samples(plateau.parse_args(["sft"]), tmp_path, tokenizer=None)
    assert got == {
        "sft": [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}, {"input_ids": [6, 7], "loss_mask": [1, 1]}],
        "fresh": [{"input_ids": [4, 5], "loss_mask": [0, 1]}],
    }
    (tmp_path / plateau.SAMPLES).unlink()
    (tmp_path / "teacher.json").write_text(json.dumps({"sft": ["gone"], "fresh": []}))
    with pytest.raises(SystemExit, match="tapes are gone"):
        plateau.teacher_samples(plateau.parse_args(["sft"]), tmp_path, tokenizer=None)
