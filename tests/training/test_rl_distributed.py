"""`tapekit train rl` data-parallel under `accelerate launch` with 2 CPU processes (gloo): each
step the ranks roll out disjoint shares of the step's tasks, the log is the whole step's, and
the ranks end with the same (moved) weights and the same curriculum state. Plus the record
merge on hand-made parts."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tapekit.store import TapeFilter

ROOT = Path(__file__).resolve().parents[2]
needs_train = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("accelerate") is None,
    reason="needs torch and accelerate (the train extra)",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _failed(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed launch said: the ranks' error lines, then the ends of stdout and stderr."""
    errors = [line for line in done.stderr.splitlines() if "Error" in line or "error:" in line]
    return "\n".join(errors[-40:]) + "\n" + done.stdout[-2000:] + done.stderr[-2000:]


@needs_train
def test_two_processes_roll_out_disjoint_tasks_and_end_with_equal_weights(tmp_path: Path) -> None:
    from tapekit.testing.tiny import load_tiny
    from tapekit.training._trace import weights_hash
    from tests.training.rl_toy import make_model, rollout_results

    make_model(tmp_path / "base")
    steps, tasks_per_step, group = 3, 4, 4
    config = {
        "setup": "tests.training.rl_toy:make_setup",
        "model": "base",
        "output_dir": "out",
        "steps": steps,
        "rollouts": {"tasks_per_step": tasks_per_step, "group_size": group, "max_tokens": 12, "max_loops": 2},
        "learning_rate": 3e-3,
        "curriculum": {"kind": "sec"},
        "seed": 1,
    }
    path = tmp_path / "rl.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        "-m", "tapekit.cli", "train", "rl", str(path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert done.returncode == 0, _failed(done)
    out = tmp_path / "out"
    assert done.stdout.count("step=") == steps  # rank 0 alone prints
    log = [json.loads(line) for line in (out / "rl_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(steps)) and all(r["processes"] == 2 for r in log)
    shares = [rollout_results(out / f"rollouts-r{rank}.db", f"rl-r{rank}", steps) for rank in (0, 1)]
    for step in range(steps):
        ids = [{task for task, _ in shares[rank][step]} for rank in (0, 1)]
        assert [len(shares[rank][step]) for rank in (0, 1)] == [tasks_per_step // 2 * group] * 2
        assert len(ids[0]) == len(ids[1]) == tasks_per_step // 2 and not ids[0] & ids[1]  # disjoint
        rewards = [r for rank in (0, 1) for _, r in shares[rank][step]]
        assert log[step]["groups"] == tasks_per_step  # the record counts both ranks' tasks
        assert log[step]["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    ranks = json.loads((out / "ranks.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["weights"] == ranks[1]["weights"] and ranks[0]["sampler"] == ranks[1]["sampler"]
    assert ranks[0]["sampler"]["step"] == steps
    assert any(v != 0 for v in log[-1]["sampler_values"].values())  # SEC learnt from the gathered arms
    base, _ = load_tiny(tmp_path / "base")
    final, _ = load_tiny(out / "final")
    assert weights_hash(final) == ranks[0]["weights"] != weights_hash(base)  # moved, and saved once


def _part(rank: int, rewards: list[float], tokens: int, loss: float) -> dict[str, Any]:
    record = {
        "step": 2, "policy_version": 2, "rollout_version": 2, "policy_lag": 0,
        "sampler_values": {"a": 0.1}, "sampler_probs": {"a": 1.0},
        "reward_mean": sum(rewards) / len(rewards) if rewards else None, "reward_std": 0.0,
        "score_strict": 0.0,
        "rollout_seconds": 1.0 + rank, "step_seconds": 2.0 + rank, "failed_rollouts": rank,
        "loss": loss, "clip_fraction": 0.0, "ratio_mean": 1.0, "kl": 0.0,
        "train_tokens": tokens, "train_tokens_per_s": 100.0, "grad_norm": 0.5,
    }  # fmt: skip
    return {
        "record": record,
        "rewards": rewards,
        "scores": {"strict": [float(r > 0.5) for r in rewards]},
        "tasks": [(f"t{rank}", "a")] * max(1, len(rewards)),  # drawn, even when every rollout failed
        "kept_tasks": [f"t{rank}"] if rewards else [],
        "category_rewards": [("a" if i % 2 else "b", r) for i, r in enumerate(rewards)],
        "zero_groups": rank,
        "n_groups": 1,
        "output_tokens": 50,
    }


def test_merge_records_is_the_whole_steps_record() -> None:
    from tapekit.training.rl import RLStepRecord
    from tapekit.training.rl._dist import merge_records

    merged = merge_records([_part(0, [0.0, 1.0], 30, 2.0), _part(1, [1.0, 1.0], 10, -2.0)])
    assert merged["reward_mean"] == pytest.approx(0.75)
    assert merged["reward_std"] == pytest.approx((3 * 0.25**2 + 0.75**2) ** 0.5 / 2)  # of all 4 rewards
    assert merged["score_strict"] == pytest.approx(0.75)
    assert merged["loss"] == pytest.approx((2.0 * 30 - 2.0 * 10) / 40)  # token-weighted
    assert merged["train_tokens"] == 40 and merged["train_tokens_per_s"] == 200.0
    assert merged["groups"] == 2 and merged["categories"] == {"a": 2} and merged["zero_adv_share"] == 0.5
    assert merged["rollout_seconds"] == 2.0 and merged["rollout_tokens_per_s"] == 50.0
    assert merged["failed_rollouts"] == 1 and merged["processes"] == 2
    assert merged["scored_rollouts"] == 4
    assert merged["category_rewards"] == {"a": 1.0, "b": 0.5}  # over both ranks' rollouts
    typed = RLStepRecord.from_log(merged)  # what the run keeps: the whole step's record, typed
    assert typed.processes == 2 and typed.step == 3 and typed.to_log() == merged
    # every rollout of the step failed by the environment, on both ranks
    hung = merge_records([_part(0, [], 0, 0.0), _part(1, [], 0, 0.0)])
    assert hung["reward_mean"] is None and hung["reward_std"] is None and hung["score_strict"] is None
    assert hung["scored_rollouts"] == 0
    assert hung["groups"] == 0 and hung["categories"] == {"a": 2}  # two tasks drawn, none trained
    assert hung["category_rewards"] == {}
    diverged = _part(1, [1.0], 10, 0.0)
    diverged["record"]["sampler_values"] = {"a": 0.2}
    with pytest.raises(RuntimeError, match=r"rank 1 disagrees.*sampler_values"):
        merge_records([_part(0, [1.0], 10, 0.0), diverged])


def _synthetic_rows() -> list[dict[str, Any]]:
    """4 groups of 2 tapes; groups 0 and 2 longer than 1 and 3, so the ranks' token counts differ."""
    import random

    rng = random.Random(7)
    rows = []
    for g in range(4):
        for k in range(2):
            n = 14 if g % 2 == 0 else 6
            rows.append({
                "input_ids": [rng.randrange(3, 300) for _ in range(n)],
                "loss_mask": [0, 0] + [1] * (n - 2),
                "tape_id": f"g{g}.{k}",
                "task_id": f"g{g}",
                "category": "even" if g % 2 == 0 else "odd",
                "reward": float(k == g % 2) + 0.1 * g,
            })  # fmt: skip
    return rows


def _one_step(rows: list[dict[str, Any]], dist: Any = None) -> tuple[dict[str, Any], dict[str, float]]:
    """One SGD step (no clipping) of the tiny model on ``rows``: its weights and arm rewards."""
    import torch

    from tapekit.training.rl import RLConfig
    from tapekit.training.rl._dist import RLDist
    from tests.training.rl_toy import make_model

    torch.set_num_threads(1)
    model, _ = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    rl = RLConfig(max_grad_norm=0.0, pad_id=0)
    _, _, arms = (dist or RLDist()).train_on(model, optimizer, rows, rl, 0, None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, arms


def _rank_main(rank: int, rendezvous: str, out: str) -> None:
    import torch
    import torch.distributed

    from tapekit.training.rl._dist import RLDist

    torch.distributed.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    try:
        mine = [r for r in _synthetic_rows() if int(r["task_id"][1:]) % 2 == rank]
        weights, arms = _one_step(mine, RLDist(rank=rank, world=2))
        torch.save({"weights": weights, "arms": arms}, Path(out) / f"rank{rank}.pt")
        # both ranks leave together: a rank that tears gloo down while the other still talks to
        # it can abort the other ("terminate called without an active exception")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


@needs_train
def test_a_data_parallel_step_is_the_step_on_all_the_rows(tmp_path: Path) -> None:
    # rank 0 gets the long groups, rank 1 the short ones: a plain mean of the ranks' gradients
    # would weight rank 1's few tokens like rank 0's many; the weighted mean gives the one-process
    # step on the union of the rows
    import torch
    import torch.multiprocessing

    from tests.training.rl_toy import make_model

    torch.multiprocessing.spawn(_rank_main, args=(f"file://{tmp_path}/rdv", str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    rows = _synthetic_rows()
    whole, arms = _one_step(rows)
    start = make_model()[0].state_dict()
    halves = [_one_step([r for r in rows if int(r["task_id"][1:]) % 2 == k])[0] for k in (0, 1)]
    plain = {k: (halves[0][k] + halves[1][k]) / 2 for k in whole}
    moved = [k for k in whole if not torch.equal(whole[k], start[k])]
    assert moved
    for name in whole:
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name])  # bit-identical ranks
        assert torch.allclose(ranks[0]["weights"][name], whole[name], atol=1e-6)
    assert any(not torch.allclose(plain[k], whole[k], atol=1e-4) for k in moved)  # the weighting matters
    assert ranks[0]["arms"] == ranks[1]["arms"] == pytest.approx(arms)  # SEC's arms over all groups


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "accelerate", "peft", "fastapi", "uvicorn")),
    reason="needs the train extra (torch, accelerate, peft) and fastapi + uvicorn",
)
def test_two_processes_roll_out_on_a_vllm_like_server_that_rank_0_alone_publishes_to(tmp_path: Path) -> None:
    from tapekit.store import open_store
    from tests.training.rl_toy import make_model
    from tests.training.vllm_like_server import VLLMLikeServer

    make_model(tmp_path / "base")
    steps = 2
    with VLLMLikeServer(tmp_path / "base", "tiny-base") as server:
        config = {
            "setup": "tests.training.rl_toy:make_setup", "model": "base", "output_dir": "out", "steps": steps,
            "learning_rate": 3e-3, "seed": 1, "lora": {"r": 4, "alpha": 8},
            "rollouts": {
                "tasks_per_step": 2, "group_size": 4, "max_tokens": 12, "max_loops": 2,
                "servers": [server.url], "served_model": "tiny-base", "lora_name_prefix": "toy",
            },
        }  # fmt: skip
        path = tmp_path / "rl.yaml"
        path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(_free_port()), "-m", "tapekit.cli", "train", "rl", str(path),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
        assert done.returncode == 0, _failed(done)
        events = list(server.events)
    # each version's adapter was loaded once (by rank 0), and it changed as the ranks trained
    loads = [e for e in events if e["event"] == "load"]
    assert [e["name"] for e in loads] == [f"toy-v{v}" for v in range(steps + 1)]
    assert loads[0]["sha256"] != loads[-1]["sha256"]
    served = {(e["model"], tuple(e["token_ids"])) for e in events if e["event"] == "chat"}
    # both ranks' rollouts of step s were sampled by version s on the server, with its token ids
    for rank in (0, 1):
        store = open_store(str(tmp_path / "out" / f"rollouts-r{rank}.db"))
        try:
            for step in range(steps):
                tapes = [
                    store.get_tape(i)
                    for i in store.list_tapes(where=TapeFilter(tag=f"rl:rl-r{rank}:step:{step}"))
                ]
                assert len(tapes) == 4
                prompts = {s.metadata.prompt_id for t in tapes for s in t.steps if s.metadata.prompt_id}
                calls = [store.get_llm_call(p) for p in prompts]
                assert calls and all(c.model == f"toy-v{step}" and c.tokens is not None for c in calls)
                assert all((c.model, tuple(c.tokens.output_ids)) in served for c in calls)
        finally:
            store.close()
    ranks = json.loads((tmp_path / "out" / "ranks.json").read_text())
    assert ranks[0]["weights"] == ranks[1]["weights"] and ranks[0]["sampler"] == ranks[1]["sampler"]


@needs_train
def test_settings_a_data_parallel_run_cannot_honour_are_refused() -> None:
    import torch

    from tapekit.errors import TrainingError
    from tapekit.training.rl import RLRunConfig
    from tapekit.training.rl._dist import RLDist

    two = RLDist(rank=1, world=2)
    two.check(RLRunConfig(rollouts={"tasks_per_step": 2}))
    with pytest.raises(TrainingError, match="mode='async' runs in one process"):
        two.check(RLRunConfig(rollouts={"tasks_per_step": 2}, mode="async"))
    with pytest.raises(TrainingError, match="tasks_per_step=1 is fewer than the 2 processes"):
        two.check(RLRunConfig(rollouts={"tasks_per_step": 1}))
    with pytest.raises(TrainingError, match="resample_rounds runs in one process"):
        two.check(RLRunConfig(rollouts={"tasks_per_step": 2, "resample_rounds": 1}))
    assert two.share(list("abcde")) == ["b", "d"] and two.run_name("rl") == "rl-r1"
    assert RLDist().run_name("rl") == "rl" and RLDist().seed(5) == 5 != two.seed(5)
    if not torch.cuda.is_available():
        with pytest.raises(TrainingError, match="no CUDA device"):
            two.device(RLRunConfig(device="cuda"))
    else:
        assert two.device(RLRunConfig(device="cuda")) == "cuda:0"


@needs_train
def test_close_leaves_only_a_process_group_the_run_joined() -> None:
    """A rank that exits with its gloo group up can abort as the interpreter finalises (seen in
    CI: rank 1 SIGABRT after a finished run), so the run leaves the group it joined, and only
    that one."""
    import torch.distributed as dist

    from tapekit.training.rl._dist import RLDist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        RLDist(rank=0, world=2, owns_group=False).close()  # the caller's group: kept
        assert dist.is_initialized()
        joined = RLDist(rank=0, world=2, owns_group=True)
        joined.close()
        assert not dist.is_initialized() and not joined.owns_group
        joined.close()  # twice: nothing left to leave
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
