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

import hashlib
import json
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, count, islice
from operator import is_not
from typing import Any

from pydantic import TypeAdapter

from tapekit.core import FrozenMessage
from tapekit.errors import TapekitError
from tapekit.llm.base import Prompt
from tapekit.store._text import model_json
from tapekit.store._tokens import ids_body, prompt_node_of

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


class _IdsError(TapekitError):
    """Token ids the store cannot hold (an ``Exception`` apart from the serialisation errors)."""


_OTHER = object()  # a run's key for a message that is not a FrozenMessage: never *is* a message


def _addresses_reader() -> Callable[[list[Any], int], bytes] | None:
    """``read(items, n)``: the addresses of the first ``n`` objects of the list ``items``, as
    bytes (one native pointer each, what ``id`` gives), copied in one C call; None where this
    cannot be done (not CPython, or its check on lists of known objects fails).

    Why: comparing two runs of addresses is one ``memcmp``, so a prompt's messages are
    compared with a remembered conversation by identity at about a nanosecond a message (and
    without touching the messages), where a comparison in Python (``map(operator.is_not, ...)``)
    takes 30 to 200 ns a message, and a copy of the list (``tuple(items)``, which touches every
    message) 10: on a 10,000-turn stored session those were most of the time per step.

    How: CPython keeps a list's items as an array of pointers. ``read`` hands
    ``ctypes.string_at`` the list's pointer to that array as a ctypes object *over the list's
    own field*, so the pointer is read inside the C call that copies the array, with the GIL
    held: nothing can move the array in between. ``n`` is checked against ``len(items)`` just
    before; only another thread shrinking this very list to under half its length at that
    instant (a data race on a prompt while it is being saved) could make the copy read past
    its end. Without the GIL (a free-threaded build) the list is first copied into a tuple,
    which no thread can change, and its items are read."""
    if sys.implementation.name != "cpython":
        return None
    try:
        import ctypes
    except ImportError:  # pragma: no cover - CPython without ctypes
        return None
    width = ctypes.sizeof(ctypes.c_void_p)
    if width not in (4, 8) or tuple.__itemsize__ != width:
        return None
    string_at, pointer_at = ctypes.string_at, ctypes.c_void_p.from_address
    list_items = list.__basicsize__ - 2 * width  # a list ends with: its items' array, its capacity
    tuple_items = tuple.__basicsize__  # a tuple's items follow its fixed part
    gil_enabled = getattr(sys, "_is_gil_enabled", None)
    free_threaded = gil_enabled is not None and not gil_enabled()

    def read(items: list[Any], n: int) -> bytes:
        if type(items) is not list or not 0 <= n <= len(items):
            raise IndexError(f"the addresses of {n} items of a {type(items).__name__} of {len(items)}")
        if free_threaded:
            snapshot = tuple(items)
            return string_at(id(snapshot) + tuple_items, n * width)
        return string_at(pointer_at(id(items) + list_items), n * width)

    probe = [object() for _ in range(7)]
    expected = struct.pack(f"={len(probe)}{'Q' if width == 8 else 'I'}", *map(id, probe))
    try:
        if read(probe, 7) != expected or read(probe[:3], 3) != expected[: 3 * width]:
            return None
    except Exception:  # pragma: no cover - an unexpected layout
        return None
    return read


_ADDRESSES = _addresses_reader()
_WIDTH = struct.calcsize("P")
_POINTER = "=" + ("Q" if _WIDTH == 8 else "I")


def _addresses_of(objects: Sequence[Any]) -> bytes:
    """The addresses (``id``) of ``objects``, as :func:`_addresses_reader`'s function gives
    them (used for the few new keys of a run)."""
    return struct.pack(f"={len(objects)}{_POINTER[1]}", *map(id, objects))


def _same_until(a: Sequence[Any], b: Sequence[Any], start: int, stop: int) -> int:
    """The first index ``i`` in ``[start, stop)`` where ``a[i] is not b[i]`` (``stop`` if there
    is none), comparing objects by identity, never by equality: one pass in C over two lists,
    without ``_ADDRESSES`` (a comparison in Python, 30 to 200 ns a message)."""
    if start >= stop:
        return stop
    pairs = map(is_not, islice(a, start, stop), islice(b, start, stop))
    return next(compress(count(start), pairs), stop)


def _same_address_until(a: bytes, b: bytearray, start: int, stop: int) -> int:
    """:func:`_same_until` over two runs of addresses (see :func:`_addresses_reader`): one
    ``memcmp`` when they agree, a binary search of ``memcmp`` calls where they part."""
    if start >= stop:
        return stop
    w = _WIDTH
    view = memoryview(b)
    if a.startswith(view[start * w : stop * w], start * w):
        return stop
    lo, hi = start, stop  # items [start, lo) agree, [start, hi) do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(view[lo * w : mid * w], lo * w):
            lo = mid
        else:
            hi = mid
    return lo


class _MessageRun:
    """Messages and the node of each, only ever appended to: every remembered prompt is a
    beginning of a run. ``keys[i]`` is the message itself when it is a
    :class:`~tapekit.core.FrozenMessage` (a later prompt reuses its node when it holds the same
    object there), else ``_OTHER`` (a later prompt's message there is serialised and matches
    when its node is the same); ``addresses`` are the keys' addresses (when ``_ADDRESSES``
    works; the keys hold the objects, so no other object can have one of them)."""

    __slots__ = ("addresses", "keys", "nodes")

    def __init__(self, keys: list[Any], nodes: list[str]) -> None:
        self.keys = keys
        self.nodes = nodes
        self.addresses = bytearray(_addresses_of(keys) if _ADDRESSES is not None else b"")

    def extend(self, keys: list[Any], nodes: list[str]) -> None:
        """Append ``keys`` and their ``nodes``."""
        if not keys:
            return
        self.keys.extend(keys)
        self.nodes.extend(nodes)
        if _ADDRESSES is not None:
            self.addresses += _addresses_of(keys)

    def fork(self, n: int, keys: list[Any], nodes: list[str]) -> _MessageRun:
        """A new run: the first ``n`` of this one, then ``keys`` and their ``nodes``."""
        run = _MessageRun.__new__(_MessageRun)
        run.keys = [*self.keys[:n], *keys]
        run.nodes = [*self.nodes[:n], *nodes]
        run.addresses = bytearray()
        if _ADDRESSES is not None:
            run.addresses = self.addresses[: n * _WIDTH] + _addresses_of(keys)
        return run


class _IdsRun:
    """Prompt token ids and the nodes that hold them, only ever appended to: ``nodes[j]`` holds
    the ids up to ``ends[j]``; every remembered call's ids are ``ids[:ends[j]]`` for some ``j``."""

    __slots__ = ("ends", "ids", "nodes")

    def __init__(self, ids: list[int], ends: list[int], nodes: list[str]) -> None:
        self.ids = ids
        self.ends = ends
        self.nodes = nodes


def _touch(runs: deque[Any], run: Any) -> None:
    """Make ``run`` the newest of ``runs`` (adding it if it is not there)."""
    if runs and runs[-1] is run:
        return
    for i, other in enumerate(runs):
        if other is run:
            del runs[i]
            break
    runs.append(run)


class PromptEncoder:
    """Turns prompts into their reference form and the parts to store (see the module).

    The work per call is proportional to what is new in the prompt, plus one identity
    comparison per message in C (and one equality comparison per prompt token id): a prompt that
    continues a remembered one (the same :class:`~tapekit.core.FrozenMessage` objects first)
    serialises and hashes its new messages only, and a message that is not a FrozenMessage (a
    plain dict, which :class:`~tapekit.core.Prompt` copies) is serialised and matched by its
    node, so a plain system message in front of a shared conversation costs one message."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # recent conversations (runs of messages and their nodes), newest last
        self._runs: deque[_MessageRun] = deque(maxlen=_RECENT)
        self._sent: set[str] = set()  # parts handed to the store already
        # recent calls' prompt token ids, newest last
        self._ids_runs: deque[_IdsRun] = deque(maxlen=_RECENT)

    def forget(self) -> None:
        """Forget every part handed out: later prompts bring all their parts again."""
        with self._lock:
            self._runs.clear()
            self._ids_runs.clear()
            self._sent.clear()

    def encode(
        self, prompt: Prompt, what: str, prompt_ids: list[int] | None = None
    ) -> tuple[str, list[Part], str | None]:
        """``prompt``'s reference form, the parts it needs that were not handed out before,
        and with ``prompt_ids`` (the call's token ids) the node of those ids (None for none;
        see ``_tokens.py``). ``what`` names the prompt in errors: a value the store cannot
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

    def _shared(self, messages: list[Any], bodies: dict[int, str]) -> tuple[int, _MessageRun | None]:
        """How many first messages a remembered run holds (same objects, or same nodes where
        one side is not a FrozenMessage), and that run; ``bodies`` gets the messages serialised
        on the way (by index)."""
        n = len(messages)
        best, best_run = 0, None
        addresses: bytes | None = None  # read when first needed
        for run in reversed(self._runs):
            keys, nodes = run.keys, run.nodes
            stop = min(n, len(keys))
            if stop <= best:
                continue
            i = 0
            while i < stop:
                if messages[i] is keys[i]:  # a run of the same objects from here: how long
                    if _ADDRESSES is None:
                        i = _same_until(messages, keys, i + 1, stop)
                    else:
                        if addresses is None:
                            addresses = _ADDRESSES(messages, n)
                        i = _same_address_until(addresses, run.addresses, i + 1, stop)
                if i == stop or (keys[i] is not _OTHER and type(messages[i]) is FrozenMessage):
                    break  # the end, or two FrozenMessages that are not the same object
                # a plain dict on either side: it continues the run if its node is the same
                body = bodies.get(i)
                if body is None:
                    body = bodies[i] = _MESSAGE.to_json(messages[i]).decode()
                if _sha(f"{nodes[i - 1] if i else ''}\n{body}") != nodes[i]:
                    break
                i += 1
            if i > best:
                best, best_run = i, run
                if best == n:
                    break
        return best, best_run

    def _encode(self, prompt: Prompt, prompt_ids: list[int] | None) -> tuple[str, list[Part], str | None]:
        messages = prompt.messages
        if type(messages) is not list:  # only if assigned after validation
            messages = list(messages)
        n = len(messages)
        bodies: dict[int, str] = {}
        shared, run = self._shared(messages, bodies)
        new: list[Part] = []
        sent = self._sent
        prev = run.nodes[shared - 1] if run is not None and shared else None
        new_nodes: list[str] = []
        for i in range(shared, n):
            body = bodies.get(i)
            if body is None:
                body = _MESSAGE.to_json(messages[i]).decode()
            node = _sha(f"{prev or ''}\n{body}")
            if node not in sent:
                new.append((node, prev, body))
            new_nodes.append(node)
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
        # everything is serialised: only now remember (an error above leaves no trace)
        if n:
            keys = [m if type(m) is FrozenMessage else _OTHER for m in messages[shared:]]
            if run is None:  # a new conversation
                run = _MessageRun(keys, new_nodes)
            elif shared == len(run.keys):  # continues the run: extend it
                run.extend(keys, new_nodes)
            elif shared < n:  # a fork of the run (its beginning is copied, once)
                run = run.fork(shared, keys, new_nodes)
            _touch(self._runs, run)
        if len(sent) + len(new) > _MAX_SENT:
            sent.clear()
        sent.update(p[0] for p in new)
        ref = (
            f'{{"v":2,"id":{json.dumps(prompt.id)},"n":{n},"messages":{_quoted(prev)},'
            f'"tools":{_quoted(values[0])},"response_schema":{_quoted(values[1])}}}'
        )
        return ref, new, ids

    def _ids(self, prompt_ids: list[int], new: list[Part]) -> str | None:
        """The node of ``prompt_ids`` (None for no ids), remembered; its new node (if any) is
        added to ``new``. The longest beginning that ends where a recent call's ids had a node
        is found by comparing the ids as lists (one pass in C), and only the ids past it are
        packed."""
        n = len(prompt_ids)
        best, best_run, best_j = 0, None, 0  # best_j: how many of best_run's nodes are shared
        for run in reversed(self._ids_runs):
            ends, ids = run.ends, run.ids
            if ends[0] > n or ends[-1] <= best:
                continue
            r = len(ids)
            # the usual case first: ids that extend (or repeat) the run's
            if r <= n and prompt_ids[r - 1] == ids[r - 1] and prompt_ids[:r] == ids:
                lo = len(ends)
            else:  # prefix matches are monotone in the length: bisect over the node ends
                lo, hi = 0, len(ends)
                while lo < hi:  # ends[:lo] match
                    mid = (lo + hi) // 2
                    end = ends[mid]
                    if end <= n and prompt_ids[end - 1] == ids[end - 1] and prompt_ids[:end] == ids[:end]:
                        lo = mid + 1
                    else:
                        hi = mid
            if lo and ends[lo - 1] > best:
                best, best_run, best_j = ends[lo - 1], run, lo
                if best == n:
                    break
        node = best_run.nodes[best_j - 1] if best_run is not None else None
        if best < n:
            try:
                body = ids_body(prompt_ids[best:])
            except ValueError as e:
                raise _IdsError(str(e)) from None
            base, node = node, _sha(f"{node or ''}\n{body}")
            if node not in self._sent:
                new.append((node, base, body))
            tail = prompt_ids[best:]
            if best_run is not None and best_j == len(best_run.ends):  # continues the run
                best_run.ids.extend(tail)
                best_run.ends.append(n)
                best_run.nodes.append(node)
            else:  # a new run, or a fork of one (copied once)
                if best_run is None:
                    best_run = _IdsRun(list(tail), [n], [node])
                else:
                    best_run = _IdsRun(
                        best_run.ids[:best] + tail,
                        [*best_run.ends[:best_j], n],
                        [*best_run.nodes[:best_j], node],
                    )
        if best_run is not None:
            _touch(self._ids_runs, best_run)
        return node


def resolve_rows(
    rows: Iterable[tuple[str, str | None]],
    fetch: Callable[[Sequence[str]], Iterable[tuple[str, str | None, str]]],
    parts: dict[str, tuple[str | None, str]],
) -> None:
    """Add to ``parts`` what stored calls need that it lacks, given their ``(prompt,
    token_meta)`` columns (either form): ``fetch(hashes)`` returns the rows of those parts and
    of every node before them."""
    wanted = {h for p, _ in rows if is_reference(p) for h in needed_parts(p) if h not in parts}
    wanted.update(h for _, m in rows if (h := prompt_node_of(m)) is not None and h not in parts)
    if wanted:
        for h, prev, body in fetch(sorted(wanted)):
            parts[h] = (prev, body)
