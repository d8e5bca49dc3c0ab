"""The paper's Figure 3 team (analyst -> search_agent) end to end, with a scripted LLM.

Checks every step's author, node and node-run grouping, the tape view stack at chosen steps,
and that stopping after ANY step (even inside a node run) and resuming gives the same tape.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tapekit import Call, Respond, SetNextNode, Tape, async_main_loop, main_loop
from tapekit._diff import signatures
from tapekit.testing.analyst import ENVIRONMENT, make_analyst, run, start_tape

EXPECTED = [  # (agent, node, kind) for each step of the Vulcan session
    ("", "", "user"),
    ("analyst", "plan", "assistant_thought"),
    ("analyst", "act", "set_next_node"),
    ("analyst", "act", "tool_call"),
    ("", "", "tool_result"),
    ("analyst", "act", "set_next_node"),
    ("analyst", "act", "tool_call"),
    ("", "", "tool_result"),
    ("analyst", "act", "set_next_node"),
    ("analyst", "act", "call"),
    ("analyst/search_agent", "search", "tool_call"),
    ("analyst/search_agent", "search", "set_next_node"),
    ("", "", "tool_result"),
    ("analyst/search_agent", "search", "tool_call"),
    ("analyst/search_agent", "search", "set_next_node"),
    ("", "", "tool_result"),
    ("analyst/search_agent", "search", "respond"),
    ("analyst", "act", "set_next_node"),
    ("analyst", "act", "assistant"),
]
RUNS = [[1], [2, 3], [5, 6], [8, 9], [10, 11], [13, 14], [16], [17, 18]]


@pytest.fixture(scope="module")
def final() -> Tape[Any, Any]:
    tape = run()
    assert tape.metadata.error is None
    return tape


def test_every_step_has_the_right_author_and_node(final: Tape[Any, Any]) -> None:
    got = [(s.metadata.agent, s.metadata.node, s.kind) for s in final.steps]
    assert got == EXPECTED


def test_prompt_ids_group_steps_into_node_runs(final: Tape[Any, Any]) -> None:
    steps = final.steps
    for i in (0, 4, 7, 12, 15):
        assert steps[i].metadata.prompt_id == ""
    pids = []
    for run_indices in RUNS:
        ids = {steps[i].metadata.prompt_id for i in run_indices}
        assert len(ids) == 1 and "" not in ids
        pids.append(ids.pop())
        assert [steps[i].metadata.run_end for i in run_indices] == [False] * (len(run_indices) - 1) + [True]
    assert len(set(pids)) == len(RUNS)
    agent = make_analyst()
    assert [index for _, index in agent.get_node_runs(final)] == [r[0] for r in RUNS]
    assert [node.name for node, _ in agent.get_node_runs(final)] == [
        "plan",
        "act",
        "act",
        "act",
        "search",
        "search",
        "search",
        "act",
    ]


def test_view_stack_inside_the_search_helper(final: Tape[Any, Any]) -> None:
    agent = make_analyst()
    stack = agent.compute_view(final[:16])  # after step 15, as in the paper's figure
    assert [v.agent_name for v in stack.views] == ["analyst", "analyst/search_agent"]
    analyst, search = stack.views
    assert list(analyst.steps) == list(final.steps[:10])
    assert analyst.next_node == "act"
    assert list(search.steps) == list(final.steps[9:16])
    assert isinstance(search.call, Call) and search.call.content == "Vulcan company overview"
    assert search.next_node == "search" and search.last_node == "search"
    assert agent.find_agent(stack.top.agent_name).name == "search_agent"


def test_view_stack_after_the_response(final: Tape[Any, Any]) -> None:
    stack = make_analyst().compute_view(final)
    assert len(stack) == 1
    (analyst,) = stack.views
    expected = [*final.steps[:10], final.steps[16], final.steps[17], final.steps[18]]
    assert list(analyst.steps) == expected
    assert isinstance(analyst.steps[10], Respond)
    assert analyst.next_node == "plan" and analyst.last_node == "act"
    assert not analyst.run_open


def test_stopping_after_any_step_and_resuming_gives_the_same_tape(final: Tape[Any, Any]) -> None:
    want = signatures(final.steps)
    for k in range(1, len(final)):
        cut = Tape.model_validate_json(final[:k].model_dump_json())  # nothing but the tape survives
        resumed = main_loop(make_analyst(), cut, ENVIRONMENT).get_final_tape()
        assert resumed.metadata.error is None, (k, resumed.metadata.error)
        assert signatures(resumed.steps) == want, f"resuming after step {k - 1} diverged"
        # the steps before the cut are kept as they were, ids included
        assert [s.metadata.id for s in resumed.steps[:k]] == [s.metadata.id for s in final.steps[:k]]


def test_a_cut_inside_a_node_run_is_finished_not_restarted(final: Tape[Any, Any]) -> None:
    cut = final[:3]  # SetNextNode written, the run's tool call not yet
    stack = make_analyst().compute_view(cut)
    assert stack.top.run_open and stack.top.last_node == "act"
    events = list(main_loop(make_analyst(), cut, ENVIRONMENT, max_loops=1))
    first_agent_tape = next(e.agent_tape for e in events if e.agent_tape is not None)
    assert len(first_agent_tape) == 4  # only the missing tool call was added
    assert first_agent_tape.steps[3].metadata.prompt_id == final.steps[2].metadata.prompt_id
    assert first_agent_tape.steps[3].metadata.run_end


def test_async_and_sync_loops_make_the_same_tape(final: Tape[Any, Any]) -> None:
    tape = asyncio.run(async_main_loop(make_analyst(), start_tape(), ENVIRONMENT).get_final_tape())
    assert signatures(tape.steps) == signatures(final.steps)


def test_the_loop_stops_waiting_for_the_user(final: Tape[Any, Any]) -> None:
    events = list(main_loop(make_analyst(), start_tape(), ENVIRONMENT))
    assert events[-1].external is not None
    assert events[-1].external.action.kind == "assistant"
    assert "Vulcan Materials" in final.steps[-1].content  # type: ignore[attr-defined]
    set_next = [s for s in final.steps if isinstance(s, SetNextNode)]
    assert [s.next_node for s in set_next] == ["act", "act", "act", "search", "search", "plan"]
