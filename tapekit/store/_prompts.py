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

A call's prompt token ids are nodes too, one per call (body ``t2:`` or ``t4:`` and the ids
in base64), chained to the node that ends the longest beginning a recent call of the store had
(``_tokens.py`` keeps the rest of the trace).

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

import base64
import hashlib
import json
import struct
import sys
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, count, repeat
from operator import is_not
from typing import Any

from pydantic import TypeAdapter

from tapekit.core import FrozenMessage
from tapekit.errors import TapekitError
from tapekit.llm.base import Prompt
from tapekit.store._text import model_json

__all__ = [
    "Part",
    "PromptEncoder",
    "ids_body",
    "ids_of",
    "is_reference",
    "needed_parts",
    "prompt_json",
    "resolve_rows",
]

#: a row of the ``prompt_parts`` table: ``(hash, prev, body)``
Part = tuple[str, str | None, str]

_REFERENCE = '{"v":2,'  # how the reference form starts (a whole Prompt's JSON starts with {"id":)
# their serialisers (the same JSON as TypeAdapter.dump_json, without its per-call overhead)
_MESSAGE = TypeAdapter(dict[str, Any]).serializer
_TOOLS = TypeAdapter(list[dict[str, Any]]).serializer
_RECENT = 64  # prompts remembered for their shared beginnings (concurrent conversations)
_MAX_SENT = 1_000_000  # parts remembered as queued; past that the set starts again (harmless)


def _quoted(h: str | None) -> str:
    """A hash (hex digits, nothing to escape) or None as JSON."""
    return "null" if h is None else f'"{h}"'


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


_IdsEntry = tuple[bytes, tuple[int, ...], tuple[str, ...]]


class _IdsError(TapekitError):
    """Token ids the store cannot hold (an ``Exception`` apart from the serialisation errors)."""


def ids_body(ids: Sequence[int]) -> str:
    """A node's body for token ids: ``t2:`` or ``t4:`` (little-endian uint16 when every id
    fits, else int32) and the bytes in base64 (no newline, and never starts like JSON)."""
    try:
        return "t2:" + base64.b64encode(struct.pack(f"<{len(ids)}H", *ids)).decode()
    except struct.error:
        return "t4:" + base64.b64encode(struct.pack(f"<{len(ids)}i", *ids)).decode()


def ids_of(node: str | None, parts: Mapping[str, tuple[str | None, str]], n: int) -> list[int]:
    """The ``n`` token ids that end with node ``node`` (None: none), from ``parts``."""
    chunks: list[str] = []
    try:
        while node is not None:
            node, body = parts[node]
            chunks.append(body)
    except KeyError as e:
        raise LookupError(f"stored token ids refer to the part {e.args[0]} which the store lacks") from None
    out: list[int] = []
    for body in reversed(chunks):
        values = array("H" if body.startswith("t2:") else "i")
        values.frombytes(base64.b64decode(body[3:]))
        if sys.byteorder != "little":
            values.byteswap()
        out.extend(values)
    if len(out) != n:
        raise LookupError(f"stored token ids: {len(out)} prompt ids, not {n}")
    return out


class PromptEncoder:
    """Turns prompts into their reference form and the parts to store (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # recent all-FrozenMessage prompts: (their messages, the node of each), newest last
        self._recent: deque[tuple[tuple[Any, ...], tuple[str, ...]]] = deque(maxlen=_RECENT)
        self._sent: set[str] = set()  # parts handed to the store already
        # recent calls' prompt token ids: (int32 bytes, where each node ends, the nodes)
        self._recent_ids: deque[_IdsEntry] = deque(maxlen=_RECENT)

    def forget(self) -> None:
        """Forget every part handed out: later prompts bring all their parts again."""
        with self._lock:
            self._recent.clear()
            self._recent_ids.clear()
            self._sent.clear()

    def encode(
        self, prompt: Prompt, what: str, prompt_ids: list[int] | None = None
    ) -> tuple[str, list[Part], str | None]:
        """``prompt``'s reference form, the parts it needs that were not handed out before,
        and with ``prompt_ids`` (the call's token ids) the node of those ids (None for none;
        see :func:`ids_node`). ``what`` names the prompt in errors: a value the store cannot
        hold is a ``ValueError`` as from :func:`~tapekit.store._text.model_json`, an id outside
        int32 a ``ValueError`` saying so; nothing is remembered then."""
        try:
            with self._lock:
                return self._encode(prompt, prompt_ids)
        except _IdsError as e:
            raise ValueError(str(e)) from None
        except ValueError:
            model_json(prompt, what)  # the same error, naming the field
            raise

    def _encode(self, prompt: Prompt, prompt_ids: list[int] | None) -> tuple[str, list[Part], str | None]:
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
            body = _MESSAGE.to_json(message).decode()
            node = _sha(f"{prev or ''}\n{body}")
            if node not in sent:
                new.append((node, prev, body))
            chain.append(node)
            prev = node
        values: list[str | None] = []
        for value in (
            None if prompt.tools is None else _TOOLS.to_json(prompt.tools).decode(),
            None if prompt.response_schema is None else _MESSAGE.to_json(prompt.response_schema).decode(),
        ):
            h = None if value is None else _sha(value)
            if h is not None and value is not None and h not in sent:
                new.append((h, None, value))
            values.append(h)
        ids = None if prompt_ids is None else self._ids(prompt_ids, new)
        # everything is serialised: only now remember (an error above leaves no trace) the
        # beginning made of FrozenMessage objects, the only ones reused as they are (the shared
        # beginning is made of them: only the new messages need a look)
        tail = messages[shared:]
        frozen = shared + next(
            compress(count(), map(is_not, map(type, tail), repeat(FrozenMessage))), len(tail)
        )
        if frozen:
            self._recent.append((tuple(messages[:frozen]), tuple(chain[:frozen])))
        if ids is not None and ids[1][1]:  # (no ids: nothing to share)
            self._recent_ids.append(ids[1])
        if len(sent) + len(new) > _MAX_SENT:
            sent.clear()
        sent.update(p[0] for p in new)
        ref = (
            f'{{"v":2,"id":{json.dumps(prompt.id)},"n":{n},"messages":{_quoted(prev)},'
            f'"tools":{_quoted(values[0])},"response_schema":{_quoted(values[1])}}}'
        )
        return ref, new, None if ids is None else ids[0]

    def _ids(self, prompt_ids: list[int], new: list[Part]) -> tuple[str | None, _IdsEntry]:
        """The node of ``prompt_ids`` (None for no ids) and what to remember of them; their new
        node (if any) is added to ``new``. The ids are compared packed as int32, so finding the
        longest stored beginning is a few memory comparisons, not work per id."""
        n = len(prompt_ids)
        try:
            packed = struct.pack(f"<{n}i", *prompt_ids)
        except struct.error as e:
            raise _IdsError(f"its token ids cannot be stored: every id must be an int32 ({e})") from None
        # the longest beginning that ends where a recent call's ids had a node
        best, base = 0, None
        ends: tuple[int, ...] = ()
        nodes: tuple[str, ...] = ()
        for old, old_ends, old_nodes in reversed(self._recent_ids):
            if old_ends[-1] <= best:
                continue
            # the usual cases first: the same ids, or ids that extend the old ones (no copies)
            lo, hi = (len(old_ends), 0) if packed.startswith(old) else (0, len(old_ends))
            # prefix matches are monotone in the length: bisect over the node ends
            while lo < hi:  # old_ends[:lo] match
                mid = (lo + hi) // 2
                end = old_ends[mid]
                if end <= n and packed[: 4 * end] == old[: 4 * end]:
                    lo = mid + 1
                else:
                    hi = mid
            if lo and old_ends[lo - 1] > best:
                best, base = old_ends[lo - 1], old_nodes[lo - 1]
                ends, nodes = old_ends[:lo], old_nodes[:lo]
                if best == n:
                    break
        node = base
        if best < n:
            body = ids_body(prompt_ids[best:])
            node = _sha(f"{base or ''}\n{body}")
            if node not in self._sent:
                new.append((node, base, body))
            ends, nodes = (*ends, n), (*nodes, node)
        return node, (packed, ends, nodes)


def resolve_rows(
    rows: Iterable[tuple[str, str | None]],
    fetch: Callable[[Sequence[str]], Iterable[tuple[str, str | None, str]]],
    parts: dict[str, tuple[str | None, str]],
) -> None:
    """Add to ``parts`` what stored calls need that it lacks, given their ``(prompt,
    token_meta)`` columns (either form): ``fetch(hashes)`` returns the rows of those parts and
    of every node before them."""
    from tapekit.store._tokens import prompt_node_of

    wanted = {h for p, _ in rows if is_reference(p) for h in needed_parts(p) if h not in parts}
    wanted.update(h for _, m in rows if (h := prompt_node_of(m)) is not None and h not in parts)
    if wanted:
        for h, prev, body in fetch(sorted(wanted)):
            parts[h] = (prev, body)
