"""A model's output that is not valid Unicode never ends a stored session, on SQLite and on
PostgreSQL: each lone surrogate an LLM makes is written as its escape (six ASCII characters),
in the steps and in the stored LLM calls (see ``tapekit.llm.base.escape_lone_surrogates``).

The PostgreSQL runs use a throwaway cluster, as in ``tests/store/test_store.py``, and skip with the
reason where the server binaries or psycopg are missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit import (
    Agent,
    AssistantThought,
    FunctionLLM,
    Node,
    Prompt,
    Respond,
    Tape,
    ToolEnvironment,
    UserStep,
    main_loop,
)
from tapekit.llm.base import LLMStream
from tapekit.store import TapeStore, open_store
from tapekit.store._text import text_problem
from tapekit.structured import LLMOutputParsingFailure, StructuredNode
from tapekit.testing.postgres import TempPostgres

# What the scripted model answers. The plain node's text holds a raw lone surrogate and a
# surrogate pair split into two code points; the structured node first answers prose with a raw
# lone surrogate (a parsing failure, then the node's retry), then valid JSON holding one as a
# JSON escape (json.loads accepts it) and one as a raw code point.
THOUGHT = "half \ud83d, whole \ud83d\ude00"
NOT_JSON = "not JSON \ud83d"
JSON_ANSWER = '{"steps": [{"kind": "respond", "content": "escaped \\ud83d, raw \ud83d"}]}'

# What the tape and the LLM-call records hold instead: the escape, six ASCII characters.
THOUGHT_STORED = "half \\ud83d, whole \U0001f600"
NOT_JSON_STORED = "not JSON \\ud83d"
REPLY_STORED = "escaped \\ud83d, raw \\ud83d"


class ThinkNode(Node):
    """A plain-text node: the LLM's text becomes a thought as it is."""

    name: str = "think"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": "think"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Any]:
        yield AssistantThought(content=llm_stream.get_text())


def half_emoji_answer(prompt: Prompt) -> str:
    """The scripted model (a function of the prompt, so each batch tape gets the same answers)."""
    if prompt.messages[-1]["content"] == "think":
        return THOUGHT
    retried = any("not JSON" in str(m.get("content")) for m in prompt.messages)
    return JSON_ANSWER if retried else NOT_JSON


def half_emoji_agent() -> Agent:
    """A plain node, then a structured node that retries once after a parsing failure."""
    return Agent.create(
        "scribe",
        llms=FunctionLLM(fn=half_emoji_answer),
        nodes=[ThinkNode(), StructuredNode(name="answer", step_classes=[Respond], max_retries=1)],
    )


def check_half_emoji_session(store: TapeStore, tape: Tape[Any, Any]) -> None:
    """``tape`` (as stored) finished with the escapes in place, and so did its LLM calls."""
    assert tape.metadata.error is None
    assert [s.kind for s in tape.steps] == [
        "user",
        "assistant_thought",
        "set_next_node",
        "llm_output_parsing_failure",
        "respond",
    ]
    thought, failure, reply = tape.steps[1], tape.steps[3], tape.steps[4]
    assert isinstance(thought, AssistantThought) and thought.content == THOUGHT_STORED
    assert isinstance(failure, LLMOutputParsingFailure) and failure.raw == NOT_JSON_STORED
    assert "not JSON" in failure.error
    assert isinstance(reply, Respond) and reply.content == REPLY_STORED
    outputs = []
    for step in (thought, failure, reply):
        call = store.llm_call_for_step(step)
        assert call is not None and call.output.content is not None
        assert text_problem(call.output.content) is None  # valid Unicode, storable as it is
        outputs.append(call.output.content)
    assert outputs == [
        THOUGHT_STORED,
        NOT_JSON_STORED,
        '{"steps": [{"kind": "respond", "content": "escaped \\ud83d, raw \\ud83d"}]}',
    ]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TapeStore]:
    """A fresh, empty store: an SQLite file or a new PostgreSQL database."""
    if request.param == "sqlite":
        with open_store(str(tmp_path / "t.db")) as s:
            yield s
        return
    pg: TempPostgres = request.getfixturevalue("pg_cluster")
    url = pg.create_database()
    with open_store(url) as s:
        yield s
    pg.drop_database(url.split("/")[3].split("?")[0])


def test_a_model_answering_half_an_emoji_never_ends_a_stored_session(store: TapeStore) -> None:
    start = Tape(steps=[UserStep(content="hi")]).with_metadata(id="session")
    final = main_loop(half_emoji_agent(), start, ToolEnvironment(), store=store).get_final_tape()
    stored = store.get_tape("session")
    assert [s.llm_dict() for s in stored.steps] == [s.llm_dict() for s in final.steps]
    check_half_emoji_session(store, stored)
    check_half_emoji_session(store, final)
    # what the session stored is text like any other: a caller's own save_tape takes it as it is
    store.save_tape(stored, "copy")
    assert store.get_tape("copy").steps[-1] == stored.steps[-1]
