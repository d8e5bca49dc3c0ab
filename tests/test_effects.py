"""Effect-safe tool calls (tapekit.effects): a ``once`` tool runs at most once per call in a stored
session, whatever point a crash stopped it at, on the memory and SQLite stores (PostgreSQL runs
the same checks in tests/test_effects_postgres.py when a server is installed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tapekit import Agent, FunctionLLM, Tape, ToolEnvironment, main_loop
from tapekit.core import LLMOutput, Prompt, ToolCallRequest
from tapekit.dialog import ToolCall, ToolResult, UserStep
from tapekit.effects import NOT_DONE, UNKNOWN, InDoubtToolCall, tool_call_key
from tapekit.environment import Tool, tool
from tapekit.store import MemoryStore, SQLiteStore, TapeStore
from tapekit.testing.react import ReactNode


class Ledger:
    """The outside world: every execution of ``pay``, with the key it was given."""

    def __init__(self) -> None:
        self.paid: list[tuple[int, str]] = []

    def pay(self, amount: int) -> str:
        """Pay ``amount``."""
        self.paid.append((amount, tool_call_key()))
        return f"paid {amount}"


def _model(prompt: Prompt) -> LLMOutput:
    """Pays 5 once, then answers."""
    if any(m.get("role") == "tool" for m in prompt.messages):
        return LLMOutput(content="done")
    return LLMOutput(tool_calls=[ToolCallRequest(id="c1", name="pay", arguments='{"amount": 5}')])


def _agent(env: ToolEnvironment) -> Agent:
    return Agent.create(
        name="payer",
        llms=FunctionLLM(fn=_model, stream_chunks=False),
        nodes=[ReactNode(tools=env.tool_schemas())],
    )


@pytest.fixture(params=["memory", "sqlite"])
def store(request: Any, tmp_path: Path) -> Any:
    made: TapeStore = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "s.db")
    with made:
        yield made


def _start() -> Tape[Any, Any]:
    return Tape(steps=[UserStep(content="pay 5")])


def _until_call(store: TapeStore, ledger: Ledger, reconcile: Any = None) -> tuple[Tape[Any, Any], ToolCall]:
    """A session stopped right after the agent asked for ``pay`` (as a crash before the tool ran
    would leave it), stored."""
    env = ToolEnvironment([Tool(ledger.pay, effect="once", reconcile=reconcile)])
    start = _start()
    main_loop(_agent(env), start, None, store=store).get_final_tape()  # no environment: stops at the call
    stored = store.get_tape(start.metadata.id)
    call = stored.steps[-1]
    assert isinstance(call, ToolCall) and call.name == "pay"
    return stored, call


def _resume(store: TapeStore, tape: Tape[Any, Any], ledger: Ledger, reconcile: Any = None) -> Any:
    env = ToolEnvironment([Tool(ledger.pay, effect="once", reconcile=reconcile)])
    return main_loop(_agent(env), tape, env, store=store)


def test_a_once_call_is_journalled_and_its_key_is_the_call_step_id(store: TapeStore) -> None:
    ledger = Ledger()
    env = ToolEnvironment([Tool(ledger.pay, effect="once")])
    start = _start()
    final = main_loop(_agent(env), start, env, store=store).get_final_tape()
    call = next(s for s in final.steps if isinstance(s, ToolCall))
    result = next(s for s in final.steps if isinstance(s, ToolResult))
    assert ledger.paid == [(5, call.metadata.id)]
    assert result.content == "paid 5" and "effect" not in result.metadata.other
    [effect] = store.tool_effects(start.metadata.id)
    assert (effect.key, effect.tool, effect.arguments, effect.state) == (
        call.metadata.id,
        "pay",
        {"amount": 5},
        "done",
    )
    assert effect.result == "paid 5" and not effect.in_doubt and effect.created <= effect.updated
    assert store.tool_effects(in_doubt=True) == []


def test_resume_after_the_tool_ran_reuses_its_outcome(store: TapeStore) -> None:
    """Killed after the outcome was journalled, before the ToolResult was stored: resume makes
    the result from the journal and does not pay again."""
    ledger = Ledger()
    tape, call = _until_call(store, ledger)
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "started")
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "done", "paid 5 (before)")
    final = _resume(store, tape, ledger).get_final_tape()
    result = next(s for s in final.steps if isinstance(s, ToolResult))
    assert ledger.paid == [] and result.content == "paid 5 (before)"
    assert result.metadata.other["effect"] == "reused"


def test_resume_of_a_call_in_doubt_waits_until_a_person_resolves_it(store: TapeStore) -> None:
    ledger = Ledger()
    tape, call = _until_call(store, ledger)
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "started")
    stream = _resume(store, tape, ledger)
    waiting = [e.external for e in stream if e.external is not None]
    assert len(waiting) == 1 and isinstance(waiting[0], InDoubtToolCall)
    assert waiting[0].effect.key == call.metadata.id and "may or may not have run" in str(waiting[0])
    assert ledger.paid == []
    assert [e.key for e in store.tool_effects(in_doubt=True)] == [call.metadata.id]

    resolved = store.resolve_tool_effect(call.metadata.id, result="paid 5 (checked by hand)")
    assert resolved.state == "done" and not resolved.in_doubt
    final = _resume(store, store.get_tape(tape.metadata.id), ledger).get_final_tape()
    result = next(s for s in final.steps if isinstance(s, ToolResult))
    assert ledger.paid == [] and result.content == "paid 5 (checked by hand)"
    assert final.steps[-1].kind == "stop"


@pytest.mark.parametrize("how", ["retry", "failed"])
def test_a_person_may_say_retry_or_failed(store: TapeStore, how: str) -> None:
    ledger = Ledger()
    tape, call = _until_call(store, ledger)
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "started")
    if how == "retry":
        store.resolve_tool_effect(call.metadata.id, retry=True)
    else:
        store.resolve_tool_effect(call.metadata.id, error="the bank refused it")
    final = _resume(store, tape, ledger).get_final_tape()
    result = next(s for s in final.steps if isinstance(s, ToolResult))
    if how == "retry":
        assert ledger.paid == [(5, call.metadata.id)] and result.content == "paid 5"
        assert store.tool_effect(call.metadata.id).state == "done"  # type: ignore[union-attr]
    else:
        assert ledger.paid == [] and result.error == "the bank refused it"


def test_reconcile_settles_a_call_in_doubt(store: TapeStore) -> None:
    ledger = Ledger()
    asked: list[str] = []

    def found(call: ToolCall) -> Any:
        asked.append(call.metadata.id)
        return "paid 5 (found at the bank)"

    tape, call = _until_call(store, ledger)
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "started")
    final = _resume(store, tape, ledger, reconcile=found).get_final_tape()
    result = next(s for s in final.steps if isinstance(s, ToolResult))
    assert asked == [call.metadata.id] and ledger.paid == []
    assert result.content == "paid 5 (found at the bank)" and result.metadata.other["effect"] == "reconciled"


def test_reconcile_may_say_not_done_or_unknown(store: TapeStore) -> None:
    ledger = Ledger()

    async def not_done(call: ToolCall) -> Any:
        return NOT_DONE

    tape, call = _until_call(store, ledger)
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "started")
    final = _resume(store, tape, ledger, reconcile=not_done).get_final_tape()
    assert ledger.paid == [(5, call.metadata.id)] and final.steps[-1].kind == "stop"

    ledger = Ledger()
    tape, call = _until_call(store, ledger)
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "started")
    stream = _resume(store, tape, ledger, reconcile=lambda call: UNKNOWN)
    assert any(isinstance(e.external, InDoubtToolCall) for e in stream) and ledger.paid == []


def test_a_failing_once_tool_records_the_failure_and_is_not_run_again(store: TapeStore) -> None:
    runs: list[int] = []

    def pay(amount: int) -> str:
        """Pay."""
        runs.append(amount)
        raise RuntimeError("card declined")

    env = ToolEnvironment([Tool(pay, effect="once")])
    start = _start()
    final = main_loop(_agent(env), start, env, store=store).get_final_tape()
    result = next(s for s in final.steps if isinstance(s, ToolResult))
    assert result.error == "RuntimeError: card declined" and runs == [5]
    [effect] = store.tool_effects()
    assert effect.state == "failed" and effect.error == "RuntimeError: card declined"


def test_without_a_store_a_once_tool_just_runs() -> None:
    ledger = Ledger()
    env = ToolEnvironment([Tool(ledger.pay, effect="once")])
    final = main_loop(_agent(env), _start(), env).get_final_tape()
    assert len(ledger.paid) == 1 and any(isinstance(s, ToolResult) for s in final.steps)


def test_read_and_idempotent_tools_get_the_key_and_write_no_journal(store: TapeStore) -> None:
    keys: list[str] = []

    @tool(effect="idempotent", name="pay")
    def pay(amount: int) -> str:
        """Pay idempotently."""
        keys.append(tool_call_key())
        return "ok"

    env = ToolEnvironment([pay])
    final = main_loop(_agent(env), _start(), env, store=store).get_final_tape()
    call = next(s for s in final.steps if isinstance(s, ToolCall))
    assert keys == [call.metadata.id] and store.tool_effects() == []
    assert pay.effect == "idempotent" and pay.name == "pay"


def test_bad_declarations_and_resolutions_are_clear_errors(store: TapeStore) -> None:
    def f() -> None:
        """F."""

    with pytest.raises(ValueError, match="effect is one of"):
        Tool(f, effect="twice")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reconcile= is for tools with effect='once'"):
        Tool(f, reconcile=lambda call: None)
    with pytest.raises(LookupError, match="only available inside a tool"):
        tool_call_key()
    with pytest.raises(KeyError, match="no tool call"):
        store.resolve_tool_effect("nope", retry=True)
    ledger = Ledger()
    tape, call = _until_call(store, ledger)
    store._record_effect(call.metadata.id, tape.metadata.id, "pay", {"amount": 5}, "started")
    with pytest.raises(ValueError, match="one way"):
        store.resolve_tool_effect(call.metadata.id, result=1, retry=True)
    store.resolve_tool_effect(call.metadata.id, result=1)
    with pytest.raises(ValueError, match="not in doubt"):
        store.resolve_tool_effect(call.metadata.id, retry=True)


def test_concurrent_once_calls_each_run_once(store: TapeStore) -> None:
    """Two once calls at the tape's end run at once (worker threads) and both are journalled."""
    ledger = Ledger()

    def model(prompt: Prompt) -> LLMOutput:
        if any(m.get("role") == "tool" for m in prompt.messages):
            return LLMOutput(content="done")
        return LLMOutput(
            tool_calls=[
                ToolCallRequest(id="a", name="pay", arguments='{"amount": 1}'),
                ToolCallRequest(id="b", name="pay", arguments='{"amount": 2}'),
            ]
        )

    env = ToolEnvironment([Tool(ledger.pay, effect="once")])
    agent = Agent.create(
        name="payer",
        llms=FunctionLLM(fn=model, stream_chunks=False),
        nodes=[ReactNode(tools=env.tool_schemas())],
    )
    final = asyncio.run(_final(agent, env, store))
    assert sorted(a for a, _ in ledger.paid) == [1, 2]
    assert sorted(e.state for e in store.tool_effects()) == ["done", "done"]
    assert len([s for s in final.steps if isinstance(s, ToolResult)]) == 2


async def _final(agent: Agent, env: ToolEnvironment, store: TapeStore) -> Tape[Any, Any]:
    from tapekit import amain_loop

    return await amain_loop(agent, _start(), env, store=store).get_final_tape()


def test_mcp_tools_take_their_effect_from_their_annotations(tmp_path: Path) -> None:
    """readOnlyHint -> read, idempotentHint -> idempotent, nothing said -> once (journalled in a
    stored session); the environment's ``effects`` overrides them."""
    pytest.importorskip("mcp")
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    from tapekit.mcp import InProcessServer, MCPEnvironment

    sent: list[str] = []
    server = MCPServer("bank", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def balance() -> int:
        """The balance."""
        return 10

    @server.tool(annotations=ToolAnnotations(idempotentHint=True))
    def set_limit(limit: int) -> int:
        """Set the limit."""
        return limit

    @server.tool()
    def pay(amount: int) -> str:
        """Pay ``amount``."""
        sent.append(str(amount))
        return f"paid {amount}"

    async def session(store: TapeStore) -> tuple[dict[str, str], Tape[Any, Any]]:
        async with MCPEnvironment([InProcessServer("bank", server)], effects={"set_limit": "once"}) as env:
            effects = {name: info.effect for name, info in env.mcp_tools.items()}
            from tapekit import amain_loop

            final = await amain_loop(_agent(env), _start(), env, store=store).get_final_tape()
            return effects, final

    with SQLiteStore(tmp_path / "mcp.db") as store:
        effects, final = asyncio.run(session(store))
        assert effects == {"balance": "read", "set_limit": "once", "pay": "once"}
        [effect] = store.tool_effects()
        assert (effect.tool, effect.state, effect.result) == ("pay", "done", "paid 5")
        assert sent == ["5"] and any(isinstance(s, ToolResult) and s.content == "paid 5" for s in final.steps)
    from tapekit.mcp import effect_of_annotations

    assert effect_of_annotations(None) == "once"
    assert effect_of_annotations(ToolAnnotations(idempotentHint=True)) == "idempotent"
    with pytest.raises(ValueError, match="effects\\['x'\\] is one of"):
        MCPEnvironment([InProcessServer("bank", server)], effects={"x": "often"})  # type: ignore[dict-item]
