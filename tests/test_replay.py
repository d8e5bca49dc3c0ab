"""Replay tests: committed tapes that the example agent must reproduce exactly.

The fixtures under tests/fixtures/ were recorded with tests/fixtures/regenerate.py. If a change
to tapekit or the example makes these fail, the change altered agent behaviour: fix it, or
re-record on purpose and say why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tapekit import LLMCall, Tape, main_loop, replay_tape
from tapekit._diff import signatures
from tapekit.core import Prompt
from tapekit.llm import ReplayLLM, ReplayMissError
from tapekit.testing.analyst import ENVIRONMENT, make_analyst, start_tape

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("analyst_*.json"))


def load(path: Path) -> tuple[str, Tape[Any, Any], list[LLMCall]]:
    data = json.loads(path.read_text())
    return (
        data["question"],
        Tape.model_validate(data["tape"]),
        [LLMCall.model_validate(c) for c in data["llm_calls"]],
    )


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_recorded_tape_replays_exactly_with_recorded_llm_calls(path: Path) -> None:
    _, tape, calls = load(path)
    result = replay_tape(make_analyst(), tape, llm_calls=calls)
    assert result.ok, result.diff
    assert result.diff == "" and result.first_divergence is None
    assert signatures(result.tape.steps) == signatures(tape.steps)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_recorded_tape_replays_with_reconstructed_llm_outputs(path: Path) -> None:
    _, tape, _ = load(path)
    assert replay_tape(make_analyst(), tape).ok


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_a_fresh_run_makes_the_recorded_tape(path: Path) -> None:
    question, tape, calls = load(path)
    made = main_loop(make_analyst(), start_tape(question), ENVIRONMENT).get_final_tape()
    assert signatures(made.steps) == signatures(tape.steps)
    assert [c.prompt.content_key() for c in calls] == [c.prompt.content_key() for c in _calls_of(question)]


def _calls_of(question: str) -> list[LLMCall]:
    calls = []
    for event in main_loop(make_analyst(), start_tape(question), ENVIRONMENT):
        if event.llm_call is not None:
            calls.append(event.llm_call)
    return calls


def test_replay_reports_a_readable_diff_where_the_agent_diverges() -> None:
    _, tape, calls = load(FIXTURES[0])
    data = tape.model_dump()
    data["steps"][1]["content"] = "1. Do something else entirely."  # the recorded plan differs
    edited = Tape.model_validate(data)
    result = replay_tape(make_analyst(), edited, llm_calls=calls)
    assert not result.ok and not result
    assert result.first_divergence == 1
    assert "-[1]" in result.diff and "Do something else entirely" in result.diff
    assert "+[1]" in result.diff and "Find the ticker" in result.diff


def test_replay_with_missing_llm_calls_fails_with_the_closest_prompt_diff() -> None:
    _, tape, calls = load(FIXTURES[0])
    result = replay_tape(make_analyst(), tape, llm_calls=calls[:3])
    assert not result.ok
    assert result.error is not None and "ReplayMissError" in result.error
    assert "closest recorded prompt" in result.error


def test_replay_llm_answers_equal_prompts_and_explains_misses() -> None:
    _, _, calls = load(FIXTURES[0])
    llm = ReplayLLM(calls=calls)
    same = calls[0].prompt.model_copy(update={"id": "another-id"})
    assert llm.generate(same) == calls[0].output
    changed = Prompt(messages=[*calls[0].prompt.messages[:-1], {"role": "user", "content": "Something new"}])
    with pytest.raises(ReplayMissError, match="Something new"):
        llm.generate(changed)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_reuse_of_a_recorded_tape_rebuilds_the_recorded_llm_calls(path: Path) -> None:
    _, tape, calls = load(path)
    reused, rebuilt = make_analyst().reuse(tape)
    assert signatures(reused.steps) == signatures(tape.steps)
    assert [(c.prompt.content_key(), c.output) for c in rebuilt] == [
        (c.prompt.content_key(), c.output) for c in calls
    ]
    texts = make_analyst().make_training_text(tape)
    assert len(texts) == len(calls) == 8
    assert [t.prompt_id for t in texts] == [c.prompt.id for c in calls]


def test_an_embedded_model_session_replays_exactly_without_the_model() -> None:
    data = json.loads((Path(__file__).parent / "fixtures" / "embedded_vulcan.json").read_text())
    tape = Tape.model_validate(data["tape"])
    calls = [LLMCall.model_validate(c) for c in data["llm_calls"]]
    assert data["json_tools"] and {c.model for c in calls} == {"smollm2-135m-instruct"}
    assert any(s.kind == "call" for s in tape.steps), "the recorded session delegates to the search agent"
    result = replay_tape(make_analyst(json_tools=True), tape, llm_calls=calls)
    assert result.ok, result.diff
    assert replay_tape(make_analyst(json_tools=True), tape).ok  # outputs rebuilt by make_llm_output
