"""RL rollouts over the Ray batch backend: an agent whose LLM can be reached from another process
(a deterministic FunctionLLM here, standing in for an OpenAI-compatible server such as vLLM)
gives the same scored, stored and tagged rollouts as the local backend, with the LLM calls in
the store for the samples; an in-process policy (a lockstep batcher) is refused with a clear
error. The Ray test is skipped when Ray is not installed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit.core import Prompt
from tapekit.llm.scripted import FunctionLLM
from tapekit.store import SQLiteStore, TapeFilter
from tapekit.training.rl import collect_rollouts
from tests.conftest import ray_cluster
from tests.training.rl_toy import make_setup


def answer(prompt: Prompt) -> str:
    """The sum of the question's numbers (right for some problems, wrong for others)."""
    users = [str(m.get("content") or "") for m in prompt.messages if m.get("role") == "user"]
    numbers = [int(n) for n in re.findall(r"\d+", users[-1] if users else "")]
    return f"Answer: {sum(numbers)}"


def _collect(store: SQLiteStore, **options: Any) -> Any:
    setup = make_setup()
    return collect_rollouts(
        setup.agent_for(FunctionLLM(fn=answer)),
        setup.environment,
        list(setup.tasks[:4]),
        setup.scorers,
        reward="strict",
        group_size=2,
        step=0,
        policy_version=0,
        store=store,
        run="toy",
        max_loops=2,
        **options,
    )


def test_ray_backend_refuses_an_in_process_policy(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "r.db") as store, pytest.raises(ValueError, match="in-process policy"):
        _collect(store, backend="ray", batcher=object())
    with SQLiteStore(tmp_path / "r.db") as store:
        assert not store.list_tapes()  # refused before anything ran


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with ray_cluster(tmp_path_factory) as ray:  # workers import tests (the toy setup)
        yield ray


def test_ray_rollouts_equal_the_local_ones(tmp_path: Path, local_ray: Any) -> None:
    got = {}
    for backend in ("local", "ray"):
        with SQLiteStore(tmp_path / f"{backend}.db") as store:
            batch = _collect(store, backend=backend, ray_workers=2)
            assert len(batch.tapes) == 8 and batch.failed == 0
            assert len(store.list_tapes(where=TapeFilter(tag="rl:toy:step:0"))) == 8
            prompt_ids = [s.metadata.prompt_id for t in batch.tapes for s in t.steps if s.metadata.prompt_id]
            assert prompt_ids and all(store.get_llm_call(p) is not None for p in prompt_ids)
            got[backend] = [(t.metadata.id, t.metadata.result) for t in batch.tapes]
    assert got["ray"] == got["local"]
    rewards = {result["reward"] for _, result in got["ray"]}
    assert len(rewards) > 1  # the tasks differ: a real comparison, not of constants
