"""The conformance checks of LLM calls: the exact call behind each step, every field and token
ids kept, long conversations read back byte for byte, and totals by agent, node and tape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapekit.core import LLMOutput, Prompt, Tape
from tapekit.dialog import UserStep
from tapekit.llm.base import LLMCall, TokenTrace
from tapekit.testing.store_conformance._support import (
    StoreFactory,
    equal,
    llm_call,
    made_by,
    raises,
    recorded_session,
)


def check_every_step_leads_to_its_exact_llm_call(make_store: StoreFactory, tmp: Path) -> None:
    """A recorded session stores every LLM call; ``llm_call_for_step`` finds the one behind
    each step made by an agent; ``list_llm_calls`` lists them, by model too."""
    with make_store() as store:
        final, _ = recorded_session(store)
        for step in final.steps:
            found = store.llm_call_for_step(step)
            if step.metadata.agent:
                assert found is not None and found.prompt.id == step.metadata.prompt_id, step.metadata
            else:
                equal(found, None, "the call of a step no LLM made")
        equal((len(store.list_llm_calls()), store.list_llm_calls(model="nope")), (8, []), "list_llm_calls")
        plan = final.steps[1]
        found = store.llm_call_for_step(plan)
        assert found is not None and found.output.content == getattr(plan, "content", None)
        equal(store.get_llm_call("no such prompt"), None, "a missing call")


def check_llm_calls_keep_every_field_and_token_ids(make_store: StoreFactory, tmp: Path) -> None:
    """A stored LLM call reads back equal, its token ids and log-probs included (ids wider
    than 16 bits too); a second save of the same prompt id replaces it; lists are oldest first."""
    small = TokenTrace(
        prompt_ids=[1, 2, 3],
        output_ids=[4, 5],
        output_logprobs=[-0.5, -0.25],
        tokenizer="tk",
        policy_version="3",
    )
    wide = TokenTrace(prompt_ids=[70_000, 2], output_ids=[100_000], finish_reason="stop")
    calls = [llm_call("c1"), llm_call("c2"), llm_call("c3")]
    calls[0].tokens, calls[1].tokens = small, wide
    calls[2].model = "other"
    for n, call in enumerate(calls):
        call.timestamp = 1000.0 + n
        call.latency_s = 0.125
    with make_store() as store:
        for call in calls:
            store.save_llm_call(call)
        for call in calls:
            equal(store.get_llm_call(call.prompt.id), call, f"the stored call {call.prompt.id}")
        equal(store.list_llm_calls(), ["c1", "c2", "c3"], "oldest first")
        equal(
            (store.list_llm_calls(model="m"), store.list_llm_calls("other")),
            (["c1", "c2"], ["c3"]),
            "by model",
        )
        replaced = llm_call("c1", prompt_tokens=99)
        replaced.timestamp = 1000.0
        store.save_llm_call(replaced)
        got = store.get_llm_call("c1")
        equal((got.prompt_tokens, got.tokens) if got else None, (99, None), "a call saved again")


def check_totals_by_agent_node_and_tape(make_store: StoreFactory, tmp: Path) -> None:
    """Totals count each LLM call once per group, also when a continued tape shares the steps."""
    steps = [made_by("a", "n1", "p0"), made_by("a", "n1", "p0"), made_by("a/b", "n2", "p1")]
    tape: Tape[Any, Any] = Tape(steps=[UserStep(content="q"), *steps])
    other: Tape[Any, Any] = Tape(steps=[made_by("a", "n3", "p2")])
    with make_store() as store:
        store.save_tape(tape)
        store.save_tape(other)
        for pid, (pt, ot) in {"p0": (10, 2), "p1": (5, 1), "p2": (7, 3)}.items():
            store.save_llm_call(llm_call(pid, pt, ot))
        equal(
            store.totals("agent", tape.metadata.id),
            {
                "a": {"calls": 1, "prompt_tokens": 10, "output_tokens": 2, "cost": 0.5},
                "a/b": {"calls": 1, "prompt_tokens": 5, "output_tokens": 1, "cost": 0.5},
            },
            "totals by agent of one tape",
        )
        equal(
            store.totals("agent")["a"],
            {"calls": 2, "prompt_tokens": 17, "output_tokens": 5, "cost": 1.0},
            "totals of agent a",
        )
        equal(set(store.totals("node")), {"a.n1", "a/b.n2", "a.n3"}, "node groups")
        by_tape = store.totals("tape")
        equal(
            (by_tape[tape.metadata.id]["prompt_tokens"], by_tape[other.metadata.id]["calls"]),
            (15, 1),
            "by tape",
        )
        more = store.save_tape(tape.with_new_steps([UserStep(content="more")]))
        equal(store.totals("tape")[more], store.totals("tape")[tape.metadata.id], "a continuation's totals")
        equal(
            (store.totals("agent")["a"]["calls"], store.totals("node")["a.n1"]["calls"]),
            (2, 1),
            "no double count",
        )
        with raises(ValueError, "choose"):
            store.totals("model")  # type: ignore[arg-type]


def check_long_conversations_read_back_byte_identical(make_store: StoreFactory, tmp: Path) -> None:
    """LLM calls whose prompts hold a whole conversation (shared FrozenMessage dicts, as
    ``view_to_messages`` makes them) read back byte for byte (``model_dump_json``): every turn,
    a fork of the conversation, a trailing instruction, a message object reused after other
    messages, equal messages that serialise differently (key order, ``1`` and ``1.0``), tools,
    a response schema, no messages at all; with token ids that grow from call to call; by
    ``get_llm_call``, listed, and through JSONL."""
    from tapekit.core import FrozenMessage

    system = FrozenMessage({"role": "system", "content": "you add ü 😀"})
    again = FrozenMessage({"role": "user", "content": "again"})  # reused after other messages
    tools: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": "add", "parameters": {"x": 1.0}}}
    ]
    prompts: list[Prompt] = []
    conversation: list[Any] = [system, FrozenMessage({"role": "user", "content": "start"})]
    for turn in range(40):
        prompts.append(Prompt(id=f"main-{turn}", messages=list(conversation), tools=tools))
        if turn % 7 == 3:  # the conversation plus an instruction that is not kept
            hint = FrozenMessage({"role": "user", "content": f"hint {turn}"})
            prompts.append(Prompt(id=f"hint-{turn}", messages=[*conversation, hint, again]))
        request = {"id": f"c{turn}", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        conversation.append(FrozenMessage({"role": "assistant", "content": None, "tool_calls": [request]}))
        conversation.append(FrozenMessage({"role": "tool", "tool_call_id": f"c{turn}", "content": str(turn)}))
        if turn == 20:  # a fork: another continuation of the first 20 turns
            fork = [
                *conversation[:-1],
                FrozenMessage({"role": "tool", "tool_call_id": "c20", "content": "x"}),
            ]
            prompts.append(Prompt(id="fork", messages=[*fork, again], response_schema={"type": "object"}))
    plain = [{"role": "user", "content": "n", "n": 1}, {"content": "n", "role": "user", "n": 1.0}]
    prompts += [
        Prompt(id="plain-a", messages=plain[:1], tools=[]),
        Prompt(id="plain-b", messages=plain[1:] + plain[:1]),
        Prompt(id="again-first", messages=[again, system]),
        Prompt(id="frozen-a", messages=[system, *map(FrozenMessage, plain[:1])]),
        Prompt(id="frozen-b", messages=[system, *map(FrozenMessage, plain[1:])]),
        Prompt(id="empty"),
    ]
    calls = [
        LLMCall(prompt=p, output=LLMOutput(content=f"a {n}"), model="m", timestamp=1000.0 + n)
        for n, p in enumerate(prompts)
    ]
    # token ids that grow from call to call (stored apart, shared): the previous ids, its
    # output and a tool result; every fifth call retokenises the last id before, wide ids
    # (over 16 bits) now and then, log-probabilities on some, and no prompt ids at all
    ids: list[int] = [1, 2, 3]
    previous = 0  # how many prompt ids the call before had
    for n, call in enumerate(calls[:-1]):
        output = [100 + n, 70_000 + n] if n % 6 == 4 else [100 + n]
        if n % 5 == 3:  # the last id of the call before changes: only the one before it is shared
            ids[previous - 1] = 9
        previous = len(ids)
        call.tokens = TokenTrace(
            prompt_ids=list(ids), output_ids=output, output_logprobs=[-0.5] * len(output) if n % 2 else None
        )
        ids = [*ids, *output, 7, 8]
    calls[-1].tokens = TokenTrace(prompt_ids=[], output_ids=[5])
    expected = {c.prompt.id: c.model_dump_json() for c in calls}
    with make_store() as store:
        for call in calls:
            store.save_llm_call(call)
        for call in calls:
            got = store.get_llm_call(call.prompt.id)
            equal(got.model_dump_json() if got else None, expected[call.prompt.id], f"call {call.prompt.id}")
        equal(store.list_llm_calls(), [c.prompt.id for c in calls], "the calls, oldest first")
        store.export_jsonl(tmp / "calls.jsonl")
    with make_store() as other:
        other.import_jsonl(tmp / "calls.jsonl")
        for call in calls:
            got = other.get_llm_call(call.prompt.id)
            equal(
                got.model_dump_json() if got else None, expected[call.prompt.id], f"imported {call.prompt.id}"
            )
