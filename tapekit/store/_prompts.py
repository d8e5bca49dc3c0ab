"""How a stored LLM call keeps its prompt: content-addressed parts, so that a session whose
prompts hold the whole conversation stores each message once (linear in the session's length,
not quadratic).

A prompt's messages are a hash chain, one *node* per message: a node is ``(hash, prev, body)``
with ``body`` the message's JSON (exactly as ``Prompt.model_dump_json`` writes it), ``prev`` the
node of the message before it (None for the first) and ``hash`` the SHA-256 (hex) of
``prev + "\\n" + body`` (``prev`` empty for the first). A node therefore names the whole list of
messages up to and including its own, and prompts that share a beginning share its nodes: the
next prompt of a conversation adds the nodes of its new messages only. The tools list and the
response schema are *values*: ``(hash, None, body)`` with ``hash`` the SHA-256 of ``body``.
Pydantic's JSON never holds a raw newline, so a node's hashed text (one newline) and a value's
(none) never coincide. Full SHA-256 rather than a shorter digest: a reference is one hash per
call and one or two per message, a few percent of the file at most, and no collision argument
is needed.

The call's ``prompt`` column then holds the reference form
``{"v":2,"id":...,"n":<messages>,"messages":<last node or null>,"tools":<hash or null>,
"response_schema":<hash or null>}``; a row written before (the whole ``Prompt`` JSON, which
starts with ``{"id":``) is read as it is, so both forms live in one table. :func:`prompt_json`
rebuilds the exact JSON that ``Prompt.model_dump_json`` wrote.

:class:`PromptEncoder` (one per store) makes the parts of a prompt. To keep the work per call
proportional to what is new, it remembers the recent prompts whose messages are all
:class:`~tapekit.core.FrozenMessage` (shared read-only dicts, reused by the next prompt of a
conversation) with their nodes: the longest beginning of a new prompt made of the *same
objects* (compared by identity, never by equality: equal dicts can serialise differently)
reuses those nodes without serialising or hashing them again. It also remembers which parts it
has handed to its store already, so each part is queued once (the database's ``ON CONFLICT DO
NOTHING`` covers other processes). A store whose writer loses a write saves that write's parts
on their own (or, failing that, calls :meth:`PromptEncoder.forget`), so a later prompt never
refers to a part that is not stored.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, count, repeat
from operator import is_not
from typing import Any

from pydantic import TypeAdapter

from tapekit.core import FrozenMessage
from tapekit.llm.base import Prompt
from tapekit.store._text import model_json

__all__ = ["Part", "PromptEncoder", "is_reference", "needed_parts", "prompt_json"]

#: a row of the ``prompt_parts`` table: ``(hash, prev, body)``
Part = tuple[str, str | None, str]

_REFERENCE = '{"v":2,'  # how the reference form starts (a whole Prompt's JSON starts with {"id":)
_MESSAGE = TypeAdapter(dict[str, Any])
_TOOLS = TypeAdapter(list[dict[str, Any]])
_RECENT = 64  # prompts remembered for their shared beginnings (concurrent conversations)
_MAX_SENT = 1_000_000  # parts remembered as queued; past that the set starts again (harmless)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_reference(prompt: str) -> bool:
    """Whether a stored ``prompt`` column holds the reference form (else the whole JSON)."""
    return prompt.startswith(_REFERENCE)


def needed_parts(prompt: str) -> list[str]:
    """The part hashes the reference form ``prompt`` starts from (its last node and values)."""
    ref = json.loads(prompt)
    return [h for h in (ref["messages"], ref["tools"], ref["response_schema"]) if h is not None]


def prompt_json(prompt: str, parts: Mapping[str, tuple[str | None, str]]) -> str:
    """The prompt's JSON (``Prompt.model_dump_json``) from its stored column: the column itself
    in the old form, else rebuilt from ``parts`` (``{hash: (prev, body)}``, holding at least
    the chain of its last node and its values)."""
    if not is_reference(prompt):
        return prompt
    ref = json.loads(prompt)
    bodies: list[str] = []
    node = ref["messages"]
    try:
        while node is not None:
            node, body = parts[node]
            bodies.append(body)
        tools = "null" if ref["tools"] is None else parts[ref["tools"]][1]
        schema = "null" if ref["response_schema"] is None else parts[ref["response_schema"]][1]
    except KeyError as e:
        raise LookupError(
            f"the stored prompt {ref['id']!r} refers to the prompt part {e.args[0]} which the store "
            "lacks (a write that failed?)"
        ) from None
    if len(bodies) != ref["n"]:
        raise LookupError(f"the stored prompt {ref['id']!r} has {len(bodies)} messages, not {ref['n']}")
    bodies.reverse()
    return (
        f'{{"id":{json.dumps(ref["id"], ensure_ascii=False)},"messages":[{",".join(bodies)}],'
        f'"tools":{tools},"response_schema":{schema}}}'
    )


class PromptEncoder:
    """Turns prompts into their reference form and the parts to store (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # recent all-FrozenMessage prompts: (their messages, the node of each), newest last
        self._recent: deque[tuple[tuple[Any, ...], tuple[str, ...]]] = deque(maxlen=_RECENT)
        self._sent: set[str] = set()  # parts handed to the store already

    def forget(self) -> None:
        """Forget every part handed out: later prompts bring all their parts again."""
        with self._lock:
            self._recent.clear()
            self._sent.clear()

    def encode(self, prompt: Prompt, what: str) -> tuple[str, list[Part]]:
        """``prompt``'s reference form and the parts it needs that were not handed out before
        (``what`` names the prompt in errors: a value the store cannot hold is a ``ValueError``
        as from :func:`~tapekit.store._text.model_json`)."""
        try:
            with self._lock:
                return self._encode(prompt)
        except ValueError:
            model_json(prompt, what)  # the same error, naming the field
            raise

    def _encode(self, prompt: Prompt) -> tuple[str, list[Part]]:
        messages = prompt.messages
        n = len(messages)
        # the longest beginning of ``messages`` that a recent prompt had, object for object
        shared: int = 0
        nodes: tuple[str, ...] = ()
        for old, old_nodes in reversed(self._recent):
            m = len(old)
            if m <= shared or shared >= n or old[shared] is not messages[shared]:
                continue
            same = next(compress(count(), map(is_not, messages, old)), min(n, m))
            if same > shared:
                shared, nodes = same, old_nodes
                if same == n:
                    break
        new: list[Part] = []
        sent = self._sent
        chain = list(nodes[:shared])
        prev = chain[-1] if chain else None
        for message in messages[shared:]:
            body = _MESSAGE.dump_json(message).decode()
            node = _sha(f"{prev or ''}\n{body}")
            if node not in sent:
                new.append((node, prev, body))
            chain.append(node)
            prev = node
        values: list[str | None] = []
        for value in (
            None if prompt.tools is None else _TOOLS.dump_json(prompt.tools).decode(),
            None if prompt.response_schema is None else _MESSAGE.dump_json(prompt.response_schema).decode(),
        ):
            h = None if value is None else _sha(value)
            if h is not None and value is not None and h not in sent:
                new.append((h, None, value))
            values.append(h)
        # everything is serialised: only now remember (an error above leaves no trace) the
        # beginning made of FrozenMessage objects, the only ones reused as they are (the shared
        # beginning is made of them: only the new messages need a look)
        tail = messages[shared:]
        frozen = shared + next(
            compress(count(), map(is_not, map(type, tail), repeat(FrozenMessage))), len(tail)
        )
        if frozen:
            self._recent.append((tuple(messages[:frozen]), tuple(chain[:frozen])))
        if len(sent) + len(new) > _MAX_SENT:
            sent.clear()
        sent.update(p[0] for p in new)
        ref = {
            "v": 2,
            "id": prompt.id,
            "n": n,
            "messages": prev,
            "tools": values[0],
            "response_schema": values[1],
        }
        return json.dumps(ref, ensure_ascii=False, separators=(",", ":")), new


def resolve_rows(
    prompts: Iterable[str],
    fetch: Callable[[Sequence[str]], Iterable[tuple[str, str | None, str]]],
    parts: dict[str, tuple[str | None, str]],
) -> None:
    """Add to ``parts`` what the stored ``prompts`` (columns, either form) need that it lacks:
    ``fetch(hashes)`` returns the rows of those parts and of every node before them."""
    wanted = {h for p in prompts if is_reference(p) for h in needed_parts(p) if h not in parts}
    if wanted:
        for h, prev, body in fetch(sorted(wanted)):
            parts[h] = (prev, body)
