"""A stored ReAct session whose prompts hold the whole conversation (shared FrozenMessage
dicts from view_to_messages) reads back byte-identical from every store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tapekit import StopStep, amain_loop
from tapekit.store import MemoryStore, SQLiteStore, TapeStore
from tapekit.testing.react import react_agent, react_start

TURNS = 60


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_long_session_prompts_read_back_byte_identical(kind: str, tmp_path: Path) -> None:
    agent, env, model = react_agent(TURNS, final="done ü 😀", record=True)
    store: TapeStore = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "long.db")
    tape = asyncio.run(
        amain_loop(agent, react_start("sys", "add, many times"), env, store=store).get_final_tape()
    )
    store.flush()
    seen = model.prompts
    assert isinstance(tape.steps[-1], StopStep) and len(seen) == TURNS + 1
    assert len(seen[-1].messages) == 2 + 2 * TURNS
    for prompt in seen:
        call = store.get_llm_call(prompt.id)
        assert call is not None
        assert call.prompt.model_dump_json() == prompt.model_dump_json()
        assert call.prompt.messages == prompt.messages
