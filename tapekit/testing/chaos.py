"""A crash-test harness: kill a stored session at chosen points, resume it, count what went wrong.

Each scenario forks a child process that runs one session of a :class:`Workload` on a store
and kills itself with ``SIGKILL`` at the *k*-th pass of one **kill point**. The kill points are
every place where being stopped matters: before and after each LLM call, each session save
(:class:`~tapekit.recording.SessionRecorder`), each transaction of the store's writer thread,
each journal record of a ``once`` tool (:mod:`tapekit.effects`: intent, outcome), and inside
the workload's tools (:func:`chaos_point`: before and after the effect on the outside world).
The first scenarios take each kind of point an uninterrupted run passes in turn (a random pass
of it), so every kind is hit once there are as many scenarios as kinds; the rest draw uniformly
from all the passes of that run. A point is named, not numbered: the writer's commits run on
their own thread, so a global count would land on another point from run to run.

The parent then resumes the stored session until it ends, as an application would: a call
left in doubt (:class:`~tapekit.effects.InDoubtToolCall`) is resolved the way the workload
says a person would (by looking at the outside world), and the session is resumed again. Then
it checks, against the workload's own record of the outside world:

- **duplicates**: an effect the workload wants once that happened more than once;
- **lost acknowledged steps**: steps the store had confirmed as committed (a journal record
  waits for the tape up to its call to be committed) that are missing after the kill;
- **unfinished**: a session that neither finished nor stopped on a call in doubt;
- **different tapes**: a resumed session whose steps (as the LLM sees them) differ from an
  uninterrupted run's, and effects that did not happen exactly once in the end.

Point it at your own agent by writing a :class:`Workload`; :class:`PaymentsWorkload` is the
built-in one (``bench/chaos.py`` runs it on SQLite and PostgreSQL, the sync and async loops,
sessions whose payments are made inside fork branches, and ``loop="batch"``: several sessions
run by one :func:`~tapekit.batch.batch`, killed together and resumed by running the batch
again). POSIX only (``os.fork``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

from tapekit.agent import Agent, Node
from tapekit.core import Fork, LLMOutput, Prompt, Respond, SetNextNode, StopStep, Tape, ToolCallRequest
from tapekit.dialog import ToolResult, UserStep, tool_calls_from_output, view_to_messages
from tapekit.effects import Effect, InDoubtToolCall, ToolEffect, tool_call_key
from tapekit.environment import Environment, Tool, ToolEnvironment
from tapekit.llm.base import LLMStream
from tapekit.llm.scripted import FunctionLLM
from tapekit.orchestrator import amain_loop, main_loop
from tapekit.store.base import TapeStore

__all__ = [
    "ChaosReport",
    "PaymentsWorkload",
    "Workload",
    "chaos_point",
    "run_chaos",
]

# --------------------------------------------------------------------------- kill points

_Target = tuple[str, int]  # die at the k-th pass (from 1) of the kill point of this name
_armed: dict[str, Any] = {"target": None, "record": False, "passes": Counter(), "order": []}


def chaos_point(name: str) -> None:
    """A kill point: in a chaos child armed to die at the *k*-th pass of the point ``name``,
    that pass kills the process with SIGKILL. Elsewhere it only counts. Put it in your tools
    around the effect on the outside world."""
    passes: Counter[str] = _armed["passes"]
    passes[name] += 1
    if _armed["record"]:
        _armed["order"].append(name)
    elif _armed["target"] == (name, passes[name]):
        _write_report({"killed_at": name})
        os.kill(os.getpid(), signal.SIGKILL)


_report_fd: list[int] = []


def _write_report(item: dict[str, Any]) -> None:
    if _report_fd:
        os.write(_report_fd[0], (json.dumps(item) + "\n").encode())


@contextlib.contextmanager
def _kill_points() -> Iterator[None]:
    """Wrap the library's places where a stop matters with kill points (in a child only)."""
    from tapekit.recording import SessionRecorder
    from tapekit.store._writer import QueuedTapeStore

    patched: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, attr: str, name: str, acknowledges: bool = False) -> None:
        original = getattr(owner, attr)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            chaos_point(f"{name}:before")
            # a journal record returns once every save before it is committed: those steps are
            # acknowledged (counted before the call: saves made meanwhile are not)
            saved = args[0]._saved.get(args[2], (0,))[0] if acknowledges else 0
            out = original(*args, **kwargs)
            if acknowledges:
                _write_report({"ack": saved, "tape": args[2]})
            chaos_point(f"{name}:after")
            return out

        patched.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    wrap(SessionRecorder, "_save", "session save")
    wrap(QueuedTapeStore, "_commit_or_isolate", "writer commit")
    wrap(TapeStore, "_record_effect", "journal record", acknowledges=True)
    try:
        yield
    finally:
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


# --------------------------------------------------------------------------- workloads


class Workload(Protocol):
    """What a chaos scenario runs and how its outside world is read."""

    name: str

    def starts(self) -> list[Tape[Any, Any]]:
        """The sessions' start tapes (the same objects for every run of a scenario): one for
        the sync and async loops, any number for ``loop="batch"``."""
        ...

    def build(self, world: Path) -> tuple[Agent, Environment]:
        """The agent and environment; their tools act on the outside world kept at ``world``."""
        ...

    def effects(self, world: Path) -> list[tuple[str, str]]:
        """Every effect the outside world saw: ``(what, key)``, one per execution."""
        ...

    def expected(self) -> list[str]:
        """The effects (``what``) an uninterrupted session makes, each exactly once."""
        ...

    def resolve(self, effect: ToolEffect, world: Path) -> dict[str, Any]:
        """How a person settles a call in doubt: keyword arguments of
        :meth:`~tapekit.store.TapeStore.resolve_tool_effect` (``result=``, ``error=`` or
        ``retry=True``)."""
        ...


class _World:
    """The outside world of :class:`PaymentsWorkload`: an SQLite file of executed payments
    (committed before the tool returns, as a bank would)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        conn.execute("CREATE TABLE IF NOT EXISTS paid (what TEXT NOT NULL, key TEXT NOT NULL)")
        return conn

    def pay(self, what: str, key: str) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.execute("INSERT INTO paid (what, key) VALUES (?, ?)", (what, key))

    def rows(self) -> list[tuple[str, str]]:
        with contextlib.closing(self._connect()) as conn:
            return [(str(a), str(b)) for a, b in conn.execute("SELECT what, key FROM paid ORDER BY rowid")]


class _PayNode(Node):
    """Pays the invoices one by one (a balance check between payments), then answers; with
    ``fork``, the invoices are paid by two clerks in concurrent fork branches."""

    name: str = "pay"
    tools: list[dict[str, Any]] = []
    fork: bool = False

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=view_to_messages(tape.steps, agent.name), tools=self.tools)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Any]:
        output = llm_stream.get_output()
        if self.fork and agent.name == "payer" and output.content == "fork":
            yield SetNextNode(next_node="pay")
            yield Fork.of(("clerk", "invoices A"), ("clerk", "invoices B"))
            return
        calls = tool_calls_from_output(output)
        if calls:
            yield SetNextNode(next_node="pay")
            yield from calls
        elif agent.name == "clerk":
            yield Respond(content=output.content or "")
        else:
            yield StopStep(reason=output.content or "done")  # the answer (no message that waits for a reply)


def _script(invoices: list[str], fork: bool) -> Callable[[Prompt], LLMOutput]:
    """The scripted model: a function of the prompt (so a resumed session asks the same)."""

    def model(prompt: Prompt) -> LLMOutput:
        messages = prompt.messages
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        first = next((m["content"] for m in messages if m["role"] == "user"), "")
        prefix = first.rsplit(" of ", 1)[1] + "-" if " of " in first else ""  # a batch's session
        results = sum(1 for m in messages if m["role"] == "tool")
        if fork and not user.startswith("invoices "):
            if any("answers" in str(m.get("content")) for m in messages):
                return LLMOutput(content="all paid")
            return LLMOutput(content="fork")
        mine = [prefix + i for i in invoices if not fork or i.startswith(user[-1])]
        plan = [("pay", i) if k % 2 == 0 else ("balance", "") for i in mine for k in range(2)]
        done_before = 0
        if fork:  # a branch's own tool results only (those after its Call)
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            done_before = sum(1 for m in messages[:last_user] if m["role"] == "tool")
        step = results - done_before
        if step >= len(plan):
            return LLMOutput(content=f"paid {len(mine)}")
        name, arg = plan[step]
        args = json.dumps({"invoice": arg}) if name == "pay" else "{}"
        return LLMOutput(tool_calls=[ToolCallRequest(id=f"c{step}", name=name, arguments=args)])

    return model


@dataclass
class PaymentsWorkload:
    """The built-in workload: pay ``invoices`` (a ``once`` tool on an SQLite "bank"), with a
    read-only balance check between payments; ``fork`` pays them in two concurrent fork
    branches; ``reconcile`` lets the tool look a payment up by its key after a crash (else a
    person resolves the call in doubt); ``effect="read"`` declares the payment tool without its
    effect, the negative control (the harness must then find duplicates); ``sessions`` > 1
    makes that many sessions, each paying its own invoices (for ``loop="batch"``)."""

    invoices: list[str] = field(default_factory=lambda: ["A1", "B1", "A2", "B2"])
    fork: bool = False
    reconcile: bool = False
    effect: Effect = "once"
    sessions: int = 1
    name: str = "payments"
    _starts: list[Tape[Any, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions must be at least 1, not {self.sessions}")
        if self.sessions == 1:
            self._starts = [Tape(steps=[UserStep(content="pay the invoices")])]
        else:  # a batch: each session pays its own invoices ("s0-A1", ...)
            self._starts = [
                Tape(steps=[UserStep(content=f"pay the invoices of s{i}")]) for i in range(self.sessions)
            ]

    def starts(self) -> list[Tape[Any, Any]]:
        """The start tapes, made with the workload object (so a forked child has the same)."""
        return self._starts

    def build(self, world: Path) -> tuple[Agent, Environment]:
        """The payer (and, with ``fork``, its clerk) on the scripted model."""
        bank = _World(world)

        def pay(invoice: str) -> str:
            """Pay an invoice."""
            chaos_point("tool pay:before")
            bank.pay(invoice, tool_call_key())
            chaos_point("tool pay:after")
            return f"paid {invoice}"

        def balance() -> int:
            """The account's balance."""
            return 100

        def look_up(call: Any) -> Any:
            from tapekit.effects import NOT_DONE

            key = tool_call_key()
            return f"paid {call.arguments['invoice']}" if any(k == key for _, k in bank.rows()) else NOT_DONE

        reconcile = look_up if self.reconcile and self.effect == "once" else None
        env = ToolEnvironment([Tool(pay, effect=self.effect, reconcile=reconcile), balance])
        llm = FunctionLLM(fn=_script(self.invoices, self.fork), stream_chunks=False)
        node = _PayNode(tools=env.tool_schemas(), fork=self.fork)
        subagents = [Agent.create(name="clerk", llms=llm, nodes=[node.model_copy()])] if self.fork else []
        agent = Agent.create(name="payer", llms=llm, nodes=[node], subagents=subagents)
        return agent, env

    def effects(self, world: Path) -> list[tuple[str, str]]:
        """The payments the bank executed."""
        return _World(world).rows() if world.exists() else []

    def expected(self) -> list[str]:
        """Each invoice of each session, once."""
        if self.sessions == 1:
            return list(self.invoices)
        return [f"s{k}-{i}" for k in range(self.sessions) for i in self.invoices]

    def resolve(self, effect: ToolEffect, world: Path) -> dict[str, Any]:
        """The person looks the payment up at the bank by its key."""
        if any(key == effect.key for _, key in self.effects(world)):
            return {"result": f"paid {effect.arguments['invoice']}"}
        return {"retry": True}


# --------------------------------------------------------------------------- the harness


@dataclass
class ChaosReport:
    """What :func:`run_chaos` found; ``ok`` when nothing went wrong."""

    scenarios: int = 0
    killed: int = 0
    kill_points: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    lost_acknowledged: int = 0
    unfinished: int = 0
    different: int = 0
    in_doubt_resolved: int = 0
    reconciled: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No duplicate, no lost acknowledged step, every session finished as uninterrupted."""
        return not (self.duplicates or self.lost_acknowledged or self.unfinished or self.different)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON data."""
        return {
            "scenarios": self.scenarios,
            "killed": self.killed,
            "kill_points": dict(sorted(self.kill_points.items())),
            "duplicates": self.duplicates,
            "lost_acknowledged": self.lost_acknowledged,
            "unfinished": self.unfinished,
            "different": self.different,
            "in_doubt_resolved": self.in_doubt_resolved,
            "reconciled": self.reconciled,
            "seconds": round(self.seconds, 1),
            "failures": self.failures[:20],
        }


Loop = Literal["sync", "async", "batch"]

BATCH = "chaos"  # the batch's name, for loop="batch"


def _stored_ids(workload: Workload, loop: Loop) -> list[str]:
    """Where the sessions are stored: the start tape's id, or the batch's ids."""
    if loop == "batch":
        from tapekit.batch import batch_tape_id

        return [batch_tape_id(BATCH, t.metadata.id) for t in workload.starts()]
    return [workload.starts()[0].metadata.id]


def _run(workload: Workload, store: TapeStore, world: Path, loop: Loop) -> list[Any]:
    """One run of the stored sessions (from the store, else from their starts): per session,
    its final tape or the InDoubtToolCall it stopped on (with the batch: None for a session
    that stopped on a call in doubt)."""
    agent, env = workload.build(world)
    if loop == "batch":
        from tapekit.batch import batch

        starts = workload.starts()
        results = batch(agent, env, starts, store=store, name=BATCH, max_concurrency=len(starts))
        return [None if r.external else r.tape for r in results]
    start = workload.starts()[0]
    try:
        tape = store.get_tape(start.metadata.id)
    except KeyError:
        tape = start
    tape_id = start.metadata.id
    waits: list[InDoubtToolCall] = []
    last = [tape]

    def follow(event: Any) -> None:  # the loop stops at a call in doubt: its event is the last
        if isinstance(event.external, InDoubtToolCall):
            waits.append(event.external)
        if event.tape is not None:
            last[0] = event.tape

    if loop == "sync":
        for event in main_loop(agent, tape, env, store=store, tape_id=tape_id):
            follow(event)
        return [waits[0] if waits else last[0]]

    async def run() -> Any:
        async for event in amain_loop(agent, tape, env, store=store, tape_id=tape_id):
            follow(event)
        return waits[0] if waits else last[0]

    return [asyncio.run(run())]


def _child(
    workload: Workload,
    open_store: Callable[[], TapeStore],
    world: Path,
    loop: Loop,
    target: _Target | None,
    fd: int,
) -> None:
    """The child's whole life: run the session, dying at kill point ``target`` (None: never,
    and report the points passed, in order)."""
    _report_fd[:] = [fd]
    _armed.update(target=target, record=target is None, passes=Counter(), order=[])
    try:
        with _kill_points(), open_store() as store:
            _run(workload, store, world, loop)
        _write_report({"points": _armed["order"]})
        os._exit(0)
    except BaseException as e:  # a failure in the child is a finding, not a crash of the harness
        _write_report({"error": f"{type(e).__name__}: {e}"})
        os._exit(3)


def _fork_run(
    workload: Workload,
    open_store: Callable[[], TapeStore],
    world: Path,
    loop: Loop,
    target: _Target | None,
) -> tuple[int, list[dict[str, Any]]]:
    """Run :func:`_child` in a forked process: its exit status and its reports."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (its coverage is not collected)
        os.close(read)
        _child(workload, open_store, world, loop, target, write)
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    reports = [json.loads(line) for line in b"".join(chunks).decode().splitlines() if line]
    return status, reports


def _signature(tape: Tape[Any, Any]) -> list[Any]:
    """A tape's steps as the LLM sees them (step ids and times left out)."""
    return [s.llm_dict() for s in tape.steps]


def _resume_until_done(
    workload: Workload, store: TapeStore, world: Path, loop: Loop, report: ChaosReport
) -> list[Tape[Any, Any]] | None:
    """Resume the stored sessions (or start them, if nothing was stored) until they end; calls
    in doubt are resolved as the workload says. None if they do not end in 10 rounds."""
    for _ in range(10):
        outs = _run(workload, store, world, loop)
        doubt = store.tool_effects(in_doubt=True)
        for effect in doubt:
            store.resolve_tool_effect(effect.key, **workload.resolve(effect, world))
            report.in_doubt_resolved += 1
        if doubt or any(not isinstance(out, Tape) for out in outs):
            continue
        return outs
    return None


def _scenario(
    workload: Workload,
    open_store: Callable[[Path], TapeStore],
    path: Path,
    loop: Loop,
    target: _Target,
    reference: list[list[Any]],
    report: ChaosReport,
    n: int,
) -> None:
    """One scenario: the child killed at kill point ``target``, then resumed and checked."""
    world = path.with_suffix(".world")
    _, reports = _fork_run(workload, partial(open_store, path.with_suffix(".db")), world, loop, target)
    report.scenarios += 1
    killed = next((r["killed_at"] for r in reports if "killed_at" in r), None)
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        report.failures.append(f"scenario {n} (kill point {target}): the child failed: {errors[0]}")
        report.unfinished += 1
        return
    if killed is not None:
        report.killed += 1
        report.kill_points[killed] += 1
    acked: dict[str, int] = {}
    for r in reports:
        if "ack" in r:
            acked[r["tape"]] = max(acked.get(r["tape"], 0), r["ack"])
    try:
        with open_store(path.with_suffix(".db")) as store:
            for tape_id, n_acked in acked.items():
                try:
                    stored = len(store.get_tape(tape_id))
                except KeyError:
                    stored = 0
                if stored < n_acked:
                    report.lost_acknowledged += 1
                    report.failures.append(
                        f"scenario {n}: {n_acked} steps of {tape_id} acknowledged, {stored} stored"
                    )
            finals = _resume_until_done(workload, store, world, loop, report)
            report.reconciled += sum(
                1
                for final in finals or []
                for s in final.steps
                if isinstance(s, ToolResult) and s.metadata.other.get("effect") == "reconciled"
            )
    except Exception as e:
        report.unfinished += 1
        report.failures.append(f"scenario {n} (killed at {killed}): resume failed: {type(e).__name__}: {e}")
        return
    made = Counter(what for what, _ in workload.effects(world))
    twice = [what for what, count in made.items() if count > 1]
    if twice:
        report.duplicates += len(twice)
        report.failures.append(f"scenario {n} (killed at {killed}): done twice: {twice}")
    if finals is None:
        report.unfinished += 1
        report.failures.append(f"scenario {n} (killed at {killed}): did not finish")
    elif (
        [_signature(f) for f in finals] != reference
        or any(f.metadata.error for f in finals)
        or sorted(made) != sorted(workload.expected())
    ):
        report.different += 1
        report.failures.append(f"scenario {n} (killed at {killed}): ended otherwise than uninterrupted")


def run_chaos(
    workload: Workload,
    open_store: Callable[[Path], TapeStore],
    scenarios: int,
    *,
    loop: Loop = "sync",
    seed: int = 0,
    workdir: Path,
    report: ChaosReport | None = None,
    forget: Callable[[Path], None] | None = None,
) -> ChaosReport:
    """Run ``scenarios`` kill-and-resume scenarios of ``workload`` (see the module docstring).

    ``open_store(path)`` opens a fresh store for one scenario (``path`` is a new file name in
    ``workdir``, for file-based stores; a PostgreSQL factory makes a new database instead);
    it is called in the child and again in the parent, and both must reach the same data.
    ``forget(path)``, if given, is called after each scenario to drop what ``open_store(path)``
    made outside ``workdir`` (a database). Results are added to ``report`` (a new one by
    default) and returned.
    """
    if scenarios < 1:
        raise ValueError(f"scenarios must be at least 1, not {scenarios}")
    report = report if report is not None else ChaosReport()
    rng = random.Random(seed)
    began = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)

    # an uninterrupted run: how many kill points it passes, and the tape it makes
    base = workdir / f"reference-{seed}"
    for old in workdir.glob(f"{base.name}.*"):
        old.unlink()
    status, reports = _fork_run(
        workload, partial(open_store, base.with_suffix(".db")), base.with_suffix(".world"), loop, None
    )
    points: list[str] = next((r["points"] for r in reports if "points" in r), [])
    if status != 0 or not points:
        raise RuntimeError(f"the uninterrupted run of {workload.name!r} failed: {reports}")
    with open_store(base.with_suffix(".db")) as store:
        reference = [_signature(store.get_tape(tape_id)) for tape_id in _stored_ids(workload, loop)]

    # each kind of point first (in a fixed order), then uniformly over every pass
    kinds = sorted(set(points))
    for n in range(scenarios):
        path = workdir / f"s{seed}-{n}"
        if n < len(kinds):
            index = rng.choice([i for i, name in enumerate(points) if name == kinds[n]])
        else:
            index = rng.randrange(len(points))
        target = (points[index], points[: index + 1].count(points[index]))
        for stale in workdir.glob(f"{path.name}.*"):
            stale.unlink()
        try:
            _scenario(workload, open_store, path, loop, target, reference, report, n)
        finally:
            for leftover in workdir.glob(f"{path.name}.*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()
            if forget is not None:
                forget(path)
    report.seconds += time.perf_counter() - began
    return report
