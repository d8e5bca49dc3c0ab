"""How much work the store does per LLM call of a long conversation (``PromptEncoder`` in
``tapekit/store/_prompts.py``): what it serialises and hashes is what is new in the prompt, a
plain-dict message in front of a shared conversation included, and what it remembers grows in
place; the comparison that finds the shared beginning is by identity (equal dicts that serialise
differently never share a node), with or without the C-level comparison of addresses.

The prompts read back byte-identical on every store in the conformance suite
(``check_long_conversations_read_back_byte_identical``); here, the encoder's own work.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit import LLMOutput, Prompt
from tapekit.core import FrozenMessage
from tapekit.llm.base import LLMCall
from tapekit.store import MemoryStore, SQLiteStore
from tapekit.store import _prompts as prompts_module
from tapekit.store._prompts import PromptEncoder
from tapekit.store._writes import call_write
from tapekit.testing.store_conformance import check_long_conversations_read_back_byte_identical

SYSTEM = {"role": "system", "content": "You add numbers."}


def _turn(n: int) -> list[FrozenMessage]:
    request = {"id": f"c{n}", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    return [
        FrozenMessage({"role": "assistant", "content": None, "tool_calls": [request]}),
        FrozenMessage({"role": "tool", "tool_call_id": f"c{n}", "content": str(n)}),
    ]


class _Counting:
    """Stands in for the encoder's message serialiser and counts the messages it serialises."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.count = 0

    def to_json(self, value: Any) -> bytes:
        self.count += 1
        return bytes(self.inner.to_json(value))


@pytest.fixture
def serialised(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Counting]:
    counting = _Counting(prompts_module._MESSAGE)
    monkeypatch.setattr(prompts_module, "_MESSAGE", counting)
    yield counting


@pytest.mark.parametrize("system", ["plain", "frozen"])
def test_each_call_serialises_only_its_new_messages(system: str, serialised: _Counting) -> None:
    """A conversation of shared FrozenMessages, with a system message in front that is a plain
    dict (``[{"role": "system", ...}, *view_to_messages(...)]``, which ``Prompt`` copies on every
    call) or a FrozenMessage: every call serialises its two new messages, plus the plain system
    message once (it is matched by its node, not its object). The store used to serialise the
    whole conversation after a plain dict, on every call."""
    encoder = PromptEncoder()
    first = SYSTEM if system == "plain" else FrozenMessage(SYSTEM)
    conversation: list[Any] = [FrozenMessage({"role": "user", "content": "add"})]
    counts = []
    node = None
    for n in range(60):
        conversation += _turn(n)
        before = serialised.count
        write = call_write(
            LLMCall(prompt=Prompt(messages=[first, *conversation]), output=LLMOutput()), encoder
        )
        counts.append(serialised.count - before)
        assert n == 0 or len(write.parts) == 2  # the nodes of the two new messages
        node = write.row[2]
    assert counts[1:] == [2 + (system == "plain")] * 59, counts
    assert node is not None and '"n":122' in node


def test_a_different_plain_system_message_shares_nothing(serialised: _Counting) -> None:
    """The same FrozenMessage conversation behind two different plain system messages: the
    second prompt's nodes are its own (the first message differs, so every node after it does),
    and both read back exactly."""
    conversation: list[Any] = [FrozenMessage({"role": "user", "content": "add"}), *_turn(0), *_turn(1)]
    with MemoryStore() as store:
        a = Prompt(id="a", messages=[SYSTEM, *conversation])
        b = Prompt(id="b", messages=[{"role": "system", "content": "Other."}, *conversation])
        reordered = Prompt(id="c", messages=[{"content": SYSTEM["content"], "role": "system"}, *conversation])
        for prompt in (a, b, reordered):
            store.save_llm_call(LLMCall(prompt=prompt, output=LLMOutput()))
        for prompt in (a, b, reordered):
            got = store.get_llm_call(prompt.id)
            assert got is not None and got.prompt.model_dump_json() == prompt.model_dump_json()


def test_a_conversation_is_remembered_in_place() -> None:
    """The encoder remembers a conversation as one run that each call extends by its new
    messages (no copy of the conversation per call, which made a stored session's time per step
    grow with its length); a fork copies the shared beginning once into a run of its own."""
    encoder = PromptEncoder()
    conversation: list[Any] = [FrozenMessage(SYSTEM)]
    for n in range(30):
        conversation += _turn(n)
        call_write(LLMCall(prompt=Prompt(messages=list(conversation)), output=LLMOutput()), encoder)
    assert len(encoder._runs) == 1
    run = encoder._runs[0]
    assert len(run.keys) == len(run.nodes) == len(conversation)
    assert all(a is b for a, b in zip(run.keys, conversation, strict=True))
    fork = [*conversation[:11], FrozenMessage({"role": "user", "content": "fork"})]
    call_write(LLMCall(prompt=Prompt(messages=fork), output=LLMOutput()), encoder)
    assert len(encoder._runs) == 2 and encoder._runs[0] is run and len(run.keys) == len(conversation)
    assert encoder._runs[1].nodes[:11] == run.nodes[:11] and len(encoder._runs[1].keys) == 12


def test_the_address_reader_checks_itself() -> None:
    """On CPython the addresses of a list's items are read in one copy and are their ids, as
    the list is now (after it grew and moved its items, and after it shrank)."""
    read = prompts_module._ADDRESSES
    if read is None:
        pytest.skip("no address reader on this interpreter (the comparison in Python is used)")
    items = [FrozenMessage({"n": i}) for i in range(100)]
    assert read(items, 100) == prompts_module._addresses_of(items)
    assert read(items, 3) == prompts_module._addresses_of(items[:3])
    items += [FrozenMessage({"n": i}) for i in range(10_000)]
    assert read(items, len(items)) == prompts_module._addresses_of(items)
    del items[50:]
    assert read(items, 50) == prompts_module._addresses_of(items)
    for bad in (51, -1):
        with pytest.raises(IndexError):
            read(items, bad)
    with pytest.raises(IndexError):
        read(tuple(items), 3)  # type: ignore[arg-type]


def test_without_the_address_reader_prompts_still_read_back_exactly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where addresses cannot be read (another interpreter), the identity comparison runs in
    Python, with the same results: the conformance check of long conversations passes."""
    monkeypatch.setattr(prompts_module, "_ADDRESSES", None)
    check_long_conversations_read_back_byte_identical(MemoryStore, tmp_path)
    numbers = iter(range(10))
    check_long_conversations_read_back_byte_identical(
        lambda: SQLiteStore(tmp_path / f"s{next(numbers)}.db"), tmp_path
    )
