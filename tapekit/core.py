"""Steps, tapes and their metadata: the data that every other part of tapekit reads and writes.

A tape is a context plus an append-only sequence of steps plus metadata. Steps are pydantic
models told apart by their ``kind`` literal, so a tape of user-defined steps round-trips through
JSON exactly. Appending to a tape shares structure with the original (see :class:`StepSequence`),
so building a session of n steps costs O(n), not O(n²).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, Generic, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, WrapValidator

from tapekit._presentation import MAX_ATTACHMENT_BYTES as MAX_ATTACHMENT_BYTES
from tapekit._presentation import Attachment as Attachment
from tapekit._presentation import StepPresentation
from tapekit._presentation import media_type_matches as media_type_matches
from tapekit.errors import TapekitError
from tapekit.sequence import StepSequence, set_default_item


def new_id() -> str:
    """A fresh random identifier (32 hex characters)."""
    return os.urandom(16).hex()  # 4x faster than uuid4().hex; ids are made for every step


# --------------------------------------------------------------------------- steps


class StepMetadata(BaseModel):
    """Who made a step and in which node run.

    ``prompt_id`` identifies the node run (and the LLM call, if any) that produced the step;
    ``agent`` is the hierarchical agent name (``analyst/search_agent``); ``node`` the node's name.
    ``run_end`` marks the last step of its node run, which lets a tape cut in the middle of a
    node run be resumed by finishing that run (see ``Agent.arun``).
    """

    id: str = Field(default_factory=new_id)
    prompt_id: str = ""
    node: str = ""
    agent: str = ""
    run_end: bool = False
    other: dict[str, Any] = Field(default_factory=dict)


class UnknownStepKindError(TapekitError, ValueError):
    """Raised when serialized data names a step ``kind`` that no loaded step class declares."""


_STEP_REGISTRY: dict[str, type[Step]] = {}
_REGISTRY_LOCK = threading.Lock()


def step_kinds() -> dict[str, type[Step]]:
    """All registered step classes by ``kind`` (a copy; for diagnostics and tooling)."""
    return dict(_STEP_REGISTRY)


# Kind prefix -> the module that defines the steps of kinds so prefixed. A module is named, not
# imported: find_step_class imports it when a stored step of such a kind is read in a process
# that has not loaded it (the Studio over a store of web tapes). The entries are tapekit's own
# optional packages; other packages add theirs with register_step_module or declare them as
# entry points of the group "tapekit.step_modules" (name: the prefix, value: the module).
_STEP_MODULES: dict[str, str] = {"web_": "tapekit.web.steps"}
_TRIED_MODULES: set[str] = set()
_ENTRY_POINTS_READ = False
_IMPORT_LOCK = threading.RLock()


def register_step_module(prefix: str, module: str) -> None:
    """Say that the step kinds starting with ``prefix`` (a whole kind, or a prefix such as
    ``"web_"``) are defined in ``module``, so :func:`find_step_class` can import it on demand.
    Imports nothing now. Which module is imported is decided by code, never by stored data: a
    stored kind only selects among the registered modules."""
    with _IMPORT_LOCK:
        _STEP_MODULES[prefix] = module
        _TRIED_MODULES.discard(module)


def find_step_class(kind: str) -> type[Step] | None:
    """The step class of ``kind``: a loaded one, else one that the module registered for the
    kind defines (imported now, the longest matching prefix first, each module tried once; a
    module that fails to import counts as not defining it, and any error but an ImportError is
    logged), else None."""
    global _ENTRY_POINTS_READ
    cls = _STEP_REGISTRY.get(kind)
    if cls is not None:
        return cls
    import importlib

    with _IMPORT_LOCK:  # not the registry's lock: an imported module registers its steps
        if not _ENTRY_POINTS_READ:
            _ENTRY_POINTS_READ = True
            from importlib.metadata import entry_points

            for point in entry_points(group="tapekit.step_modules"):
                _STEP_MODULES.setdefault(point.name, point.value)
        for prefix in sorted((p for p in _STEP_MODULES if kind.startswith(p)), key=len, reverse=True):
            module = _STEP_MODULES[prefix]
            if module in _TRIED_MODULES:
                continue
            _TRIED_MODULES.add(module)
            try:
                importlib.import_module(module)
            except ImportError:  # an optional package that is not installed
                continue
            except Exception:
                logging.getLogger(__name__).warning("importing %s failed", module, exc_info=True)
                continue
            if kind in _STEP_REGISTRY:
                break
    return _STEP_REGISTRY.get(kind)


class Step(BaseModel):
    """One entry of a tape. Subclass :class:`Thought`, :class:`Action` or :class:`Observation`.

    Concrete step classes declare ``kind: Literal["my_kind"] = "my_kind"``; the kind is how a
    serialized tape finds the class again, so it must be unique across loaded classes.
    """

    model_config = ConfigDict(extra="forbid")

    metadata: StepMetadata = Field(default_factory=StepMetadata)
    kind: str

    @classmethod
    def __sequence_item_validator__(cls) -> Callable[[Any], Step]:
        """The validator of one step in a :class:`StepSequence` of this class: a dict dispatches
        on its ``kind`` to the loaded step class (which must be a subclass of this one)."""
        return _step_validator(cls)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        field = cls.model_fields.get("kind")
        if field is None:
            return
        args = typing.get_args(field.annotation)
        if typing.get_origin(field.annotation) is not Literal or len(args) != 1:
            return  # an abstract intermediate class (kind: str)
        kind = args[0]
        if field.default != kind:
            raise TypeError(f"{cls.__qualname__}: declare `kind: Literal[{kind!r}] = {kind!r}`")
        with _REGISTRY_LOCK:
            known = _STEP_REGISTRY.get(kind)
            if known is not None and (known.__module__, known.__qualname__) != (
                cls.__module__,
                cls.__qualname__,
            ):
                raise TypeError(
                    f"step kind {kind!r} of {cls.__module__}.{cls.__qualname__} is already "
                    f"used by {known.__module__}.{known.__qualname__}; kinds must be unique"
                )
            _STEP_REGISTRY[kind] = cls

    def llm_dict(self) -> dict[str, Any]:
        """The step's content without metadata: what a prompt shows and a diff compares."""
        return self.model_dump(exclude={"metadata"}, mode="json")

    def present(self) -> StepPresentation:
        """How people see this step: its one-line summary, and for the Studio's step panel its
        own fields, attachments (a screenshot) and notes for bulky JSON fields (see
        :class:`StepPresentation`). The plain-text renderer and the Studio both use it, so a
        step class defines its look here, once.

        The default summary is the content (:meth:`llm_dict` without ``kind``): its one field's
        value, or the fields as JSON. Override it to give a better gist or a panel section;
        keep it cheap and without side effects (it runs for every step a list shows). The
        Studio also calls it on steps built without validation (``model_construct``) from
        stored data that the class no longer accepts: read fields with ``getattr`` defaults to
        still present those; if it raises, the default presentation is shown.
        """
        content = self.llm_dict()
        content.pop("kind", None)
        if len(content) == 1:
            value = next(iter(content.values()))
            summary = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        else:
            summary = json.dumps(content, ensure_ascii=False, default=str)
        return StepPresentation(summary=summary)

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        return [(k, v) for k, v in super().__repr_args__() if k != "metadata"]


class Thought(Step):
    """The agent's inner reasoning; the agent keeps running after a thought."""


class Action(Step):
    """A request to the environment; the agent stops after the node run that made it."""


class Observation(Step):
    """What the environment (a tool, a user) answered to an action."""


class ControlStep(Thought):
    """Thoughts that steer the agent machinery itself rather than carry reasoning."""


class SetNextNode(ControlStep):
    """Makes ``next_node`` (a node name, or an index into the agent's nodes) run next."""

    kind: Literal["set_next_node"] = "set_next_node"
    next_node: str | int


class Call(ControlStep):
    """Delegates to the subagent ``agent_name`` until it answers with :class:`Respond`."""

    kind: Literal["call"] = "call"
    agent_name: str
    content: str = ""

    def present(self) -> StepPresentation:
        """``calls AGENT: CONTENT``."""
        return StepPresentation(summary=f"calls {self.agent_name}: {self.content}")


class Branch(BaseModel):
    """One branch of a :class:`Fork`: a Call of subagent ``agent_name`` with ``content``."""

    model_config = ConfigDict(extra="forbid")

    agent_name: str
    content: str = ""


class Fork(ControlStep):
    """Calls several subagents at once: each branch runs concurrently, sees the tape as it was
    at the fork plus its own steps, and ends with its subagent's :class:`Respond`.

    On the tape the branches follow the fork one after another, in the order given, each as a
    ``Call`` ... ``Respond`` segment; the agent that forked then continues and sees every
    response, exactly as if it had made the calls in sequence.
    """

    kind: Literal["fork"] = "fork"
    branches: list[Branch] = Field(min_length=1)

    @classmethod
    def of(cls, *calls: tuple[str, str] | Branch) -> Fork:
        """``Fork.of(("search", "q1"), ("search", "q2"))``: a fork from (agent, content) pairs."""
        return cls(
            branches=[c if isinstance(c, Branch) else Branch(agent_name=c[0], content=c[1]) for c in calls]
        )

    def call(self, index: int) -> Call:
        """The Call step that opens branch ``index`` on the tape."""
        branch = self.branches[index]
        return Call(agent_name=branch.agent_name, content=branch.content)


class Respond(ControlStep):
    """Ends a subagent's turn and hands ``content`` back to the agent that called it."""

    kind: Literal["respond"] = "respond"
    content: str = ""

    def present(self) -> StepPresentation:
        """``responds: CONTENT``."""
        return StepPresentation(summary=f"responds: {self.content}")


class StopStep(ControlStep):
    """Ends the session: the agent stops and the orchestrator does not continue."""

    kind: Literal["stop"] = "stop"
    reason: str = ""


# --------------------------------------------------------------------------- generic steps


class GenericThought(Thought):
    """A step of a kind tapekit has no class for, made by an agent, kept as it is.

    Imported tapes carry the step kinds of the system that made them (see :mod:`tapekit.migrate`);
    a kind with no tapekit class becomes a generic step, so nothing is dropped and the tape
    loads in any process without the original step classes. ``original_kind`` is the step's
    own kind and ``fields`` its data fields (everything but ``metadata`` and ``kind``), in
    their original order.
    """

    kind: Literal["generic_thought"] = "generic_thought"
    original_kind: str
    fields: dict[str, Any] = {}


class GenericAction(Action):
    """Like :class:`GenericThought`, for agent steps whose kind names an action (``*_action``)."""

    kind: Literal["generic_action"] = "generic_action"
    original_kind: str
    fields: dict[str, Any] = {}


class GenericObservation(Observation):
    """Like :class:`GenericThought`, for steps the environment made (no agent, node or prompt)."""

    kind: Literal["generic_observation"] = "generic_observation"
    original_kind: str
    fields: dict[str, Any] = {}


class PartialStep(BaseModel):
    """A step still being produced (e.g. while tokens stream); never added to a tape."""

    step: Step


# --------------------------------------------------------------------------- LLM data types


class ToolCallRequest(BaseModel):
    """A function call that an LLM asked for; ``arguments`` is the raw JSON text."""

    id: str = ""
    name: str
    arguments: str = "{}"


class FrozenMessage(dict[str, Any]):
    """A chat message that cannot change: a ``dict`` (equal to, and serialised like, the plain
    one) whose mutating methods raise ``TypeError``.

    :func:`~tapekit.dialog.view_to_messages` returns these, shared between calls, so a prompt over
    a long conversation reuses the messages made for the previous prompt instead of copying them,
    and :class:`Prompt` takes them without copying or re-validating. To change one, make a plain
    copy first: ``dict(message)`` or ``{**message, "content": ...}``. Nested values (``tool_calls``)
    are shared as well: replace them, never mutate them.
    """

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> typing.NoReturn:
        raise TypeError(
            "this chat message is shared and read-only (a FrozenMessage): "
            "change a copy, e.g. dict(message) or {**message, 'content': ...}"
        )

    __setitem__ = __delitem__ = __ior__ = _readonly
    clear = pop = popitem = setdefault = update = _readonly

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMessage, (dict(self),))

    def __copy__(self) -> FrozenMessage:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenMessage:
        import copy

        return FrozenMessage(copy.deepcopy(dict(self), memo))


def _all_frozen(items: Iterable[Any]) -> bool:
    return all(type(m) is FrozenMessage for m in items)


class FrozenMessageList(list[dict[str, Any]]):
    """A list of chat messages that knows whether every item is a :class:`FrozenMessage`.

    :func:`~tapekit.dialog.view_to_messages` returns one. It is an ordinary, changeable ``list``;
    its methods that add items (``append``, ``extend``, ``insert``, ``+=``, item and slice
    assignment) look at the added items only and keep :attr:`all_frozen` up to date, so
    :class:`Prompt` can take a long conversation without looking at each message again (a type
    check per message is the largest cost of a prompt over thousands of messages). Methods that
    only drop or reorder items keep the flag; copies (``copy()``, ``+``, slices, pickling) are
    plain lists.
    """

    __slots__ = ("all_frozen",)

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self.all_frozen: bool = _all_frozen(self)

    @classmethod
    def _of_frozen(cls, items: list[Any]) -> FrozenMessageList:
        """The list of ``items``, known to be FrozenMessages (no check)."""
        out = cls.__new__(cls)
        list.extend(out, items)
        out.all_frozen = True
        return out

    def append(self, item: Any) -> None:
        super().append(item)
        if type(item) is not FrozenMessage:
            self.all_frozen = False

    def extend(self, items: Iterable[Any]) -> None:
        items = list(items)
        super().extend(items)
        if self.all_frozen and not _all_frozen(items):
            self.all_frozen = False

    def insert(self, index: typing.SupportsIndex, item: Any) -> None:
        super().insert(index, item)
        if type(item) is not FrozenMessage:
            self.all_frozen = False

    def __iadd__(self, items: Iterable[Any]) -> typing.Self:  # type: ignore[override,misc]
        self.extend(items)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            value = list(value)
            super().__setitem__(index, value)
            if self.all_frozen and not _all_frozen(value):
                self.all_frozen = False
            return
        super().__setitem__(index, value)
        if type(value) is not FrozenMessage:
            self.all_frozen = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


def _validate_messages(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A prompt's messages: a list of :class:`FrozenMessage` is taken as is (no per-message
    copy or validation, so a prompt over a long conversation costs no re-validation of its past),
    plain dicts with string keys are copied (as pydantic would), anything else is validated by
    pydantic as ``list[dict[str, Any]]`` (same results, same errors). A
    :class:`FrozenMessageList` that holds only FrozenMessages is copied without a look at each."""
    if type(value) is FrozenMessageList:
        if value.all_frozen:
            return value[:]  # a plain list, copied in C
        value = value[:]
    if type(value) is list:
        kinds = list(map(type, value))
        if set(kinds) <= {FrozenMessage, dict}:
            out = value[:]
            start = 0
            while True:  # only the plain dicts are looked at and copied (found by a scan in C)
                try:
                    i = kinds.index(dict, start)
                except ValueError:
                    return out
                if not all(type(k) is str for k in out[i]):
                    break
                out[i] = dict(out[i])
                start = i + 1
    return handler(value)


class Prompt(BaseModel):
    """What a node asks the LLM: chat messages, optional tool schemas and response schema.

    ``id`` is the node run's ``prompt_id``; it links every step of the run, and the stored LLM
    call, to this prompt. Messages that are :class:`FrozenMessage` (from
    :func:`~tapekit.dialog.view_to_messages`) are kept as they are, shared, without
    re-validation; plain dicts are copied.
    """

    id: str = Field(default_factory=new_id)
    messages: Annotated[list[dict[str, Any]], WrapValidator(_validate_messages)] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    response_schema: dict[str, Any] | None = None

    def content_key(self) -> str:
        """A canonical JSON text of everything but the id: equal prompts have equal keys."""
        return self.model_dump_json(exclude={"id"})


class LLMOutput(BaseModel):
    """What the LLM answered: text content and/or tool calls."""

    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallRequest] | None = None


# --------------------------------------------------------------------------- step validation


def _step_validator(base: type[Step]) -> Callable[[Any], Step]:
    """Validates one step of a tape whose step type is ``base``: dispatch on ``kind``."""

    def validate(value: Any) -> Step:
        if isinstance(value, base):
            return value
        if isinstance(value, Step):
            raise ValueError(f"step of kind {value.kind!r} is not a {base.__name__}")
        if not isinstance(value, dict):
            raise ValueError(f"a step must be a Step or a dict, got {type(value).__name__}")
        kind = value.get("kind")
        if kind is None:
            raise ValueError("step data has no 'kind' field")
        cls = _STEP_REGISTRY.get(kind)
        if cls is None:
            known = ", ".join(sorted(_STEP_REGISTRY))
            raise UnknownStepKindError(
                f"unknown step kind {kind!r}: no loaded step class declares it "
                f"(import the module that defines it; known kinds: {known})"
            )
        if not issubclass(cls, base):
            raise ValueError(f"step kind {kind!r} ({cls.__name__}) is not a {base.__name__}")
        return cls.model_validate(value)

    return validate


set_default_item(Step)  # a bare StepSequence holds steps


# --------------------------------------------------------------------------- tapes


class TapeMetadata(BaseModel):
    """Provenance of a tape: who made it, from which tape, and how it ended.

    ``parent_id`` is the tape this one continues; ``author`` the agent or environment that
    made it (by adding steps or by revising another tape, whose id is ``author_tape_id``);
    ``n_added_steps`` how many steps the author added; ``error`` what went wrong, if anything;
    ``result`` whatever the application wants to record as the session's outcome; ``other`` a
    free dict for anything else to keep with the tape (an import from the reference TapeAgents
    package keeps the fields of its metadata subclasses under ``other["tapeagents"]``).
    """

    id: str = Field(default_factory=new_id)
    parent_id: str | None = None
    author: str | None = None
    author_tape_id: str | None = None
    n_added_steps: int = 0
    error: str | None = None
    result: Any = None
    other: dict[str, Any] = Field(default_factory=dict)


ContextT = TypeVar("ContextT")
StepT = TypeVar("StepT", bound=Step)


class Tape(BaseModel, Generic[ContextT, StepT]):
    """A session's log and resumable state: context, steps and metadata.

    Declare a typed tape with ``class MyTape(Tape[MyContext, StepA | StepB]): ...`` (use
    ``Annotated[StepA | StepB, Field(discriminator="kind")]`` for the fastest parsing); a bare
    ``Tape`` accepts every registered step kind. Tapes are values: ``append``/``extend`` return
    new tapes and never change this one.
    """

    metadata: TapeMetadata = Field(default_factory=TapeMetadata)
    context: ContextT | None = None
    steps: StepSequence[StepT] = Field(default_factory=StepSequence)

    def __len__(self) -> int:
        return len(self.steps)

    def __bool__(self) -> bool:
        """Always true, even with no steps: a tape is a value, so ``a or b`` never skips an
        empty tape by accident."""
        return True

    def __iter__(self) -> Iterator[StepT]:  # type: ignore[override]
        return iter(self.steps)

    @overload
    def __getitem__(self, index: int) -> StepT: ...
    @overload
    def __getitem__(self, index: slice) -> typing.Self: ...
    def __getitem__(self, index: int | slice) -> StepT | typing.Self:
        """A step by index, or for a slice a new tape (fresh metadata) holding those steps."""
        if isinstance(index, slice):
            return self.model_copy(update={"steps": self.steps[index], "metadata": TapeMetadata()})
        return self.steps[index]

    def append(self, step: StepT) -> typing.Self:
        """A new tape with ``step`` added (fresh metadata); O(1) amortised."""
        return self.extend([step])

    def extend(self, steps: Iterable[StepT]) -> typing.Self:
        """A new tape with ``steps`` added (fresh metadata); O(len(steps)) amortised."""
        return self.model_copy(update={"steps": self.steps.appended(steps), "metadata": TapeMetadata()})

    def with_new_steps(self, steps: Iterable[StepT], **metadata: Any) -> typing.Self:
        """A continuation of this tape: ``steps`` added, ``parent_id`` set to this tape's id."""
        added = list(steps)
        meta = TapeMetadata(parent_id=self.metadata.id, n_added_steps=len(added), **metadata)
        return self.model_copy(update={"steps": self.steps.appended(added), "metadata": meta})

    def with_metadata(self, **updates: Any) -> typing.Self:
        """The same steps with some metadata fields replaced."""
        return self.model_copy(update={"metadata": self.metadata.model_copy(update=updates)})
