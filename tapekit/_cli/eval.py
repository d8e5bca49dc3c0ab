"""``tapekit eval``: an agent over a task set, k attempts per task, scored, and the report.

Tasks come from a JSONL file (one :class:`~tapekit.evaluate.Task` per line: ``id``,
``question`` or ``start``, ``expected``, ``category``, ``metadata``) or from a ``module:attr``
naming a list of tasks (or a function returning one). Scorers are ``exact`` and ``contains``
(built in) or any ``module:attr`` function ``(tape, task) -> Score``, each optionally named as
``NAME=SPEC``. Only typer is imported with this module.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tapekit._cli.common import (
    CliError,
    check_writable,
    fail,
    load_target,
    open_cli_store,
    project_on_path,
    read_text,
)

if TYPE_CHECKING:
    from tapekit.evaluate import SampleResult, Task


BUILT_IN = ("exact", "contains")


def _tasks(spec: str) -> list[Task]:
    """The tasks ``--tasks`` names, checked as :func:`~tapekit.evaluate.evaluate` would check
    them (ids present and distinct, each task with a question or a start tape), so that bad
    input stops the command before it creates a store or runs anything."""
    from pydantic import ValidationError

    from tapekit._loading import load_object
    from tapekit.evaluate import Task

    path = Path(spec)
    if path.suffix in (".jsonl", ".json") or path.exists():
        if not path.is_file():
            raise CliError(f"--tasks {spec}: no such file")
        tasks, places = [], []
        for n, line in enumerate(read_text(path, "--tasks").splitlines(), 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.model_validate_json(line))
            except ValidationError as e:
                raise CliError(f"{spec}, line {n}: not a task: {e.errors()[0]['msg']}") from None
            places.append(f"line {n}")
        if not tasks:
            raise CliError(f"--tasks {spec}: the file holds no task")
        return _checked_tasks(spec, tasks, places)
    project_on_path()
    try:
        obj: Any = load_object(spec)
    except ValueError as e:
        raise CliError(f"--tasks {spec}: {e} (a .jsonl file or module:attr)") from None
    if callable(obj):
        try:
            obj = obj()
        except Exception as e:
            raise CliError(f"--tasks {spec}: calling it failed: {type(e).__name__}: {e}") from e
    if not isinstance(obj, list | tuple) or not obj or not all(isinstance(t, Task) for t in obj):
        raise CliError(f"--tasks {spec}: must give a non-empty list of tapekit.evaluate.Task")
    return _checked_tasks(spec, list(obj), [f"tasks[{i}]" for i in range(len(obj))])


def _checked_tasks(spec: str, tasks: list[Task], places: list[str]) -> list[Task]:
    """``tasks``, each with a non-empty id of its own and something to start from; ``places``
    says where each one is (``line 3``, ``tasks[2]``) for the error message."""
    first: dict[str, str] = {}
    for task, place in zip(tasks, places, strict=True):
        if not task.id:
            raise CliError(f"--tasks {spec}: {place}: the task id is empty")
        if task.id in first:
            raise CliError(
                f"--tasks {spec}: {place} repeats task id {task.id!r} of {first[task.id]}; "
                "task ids must be distinct"
            )
        first[task.id] = place
        if task.start is None and task.question is None:
            raise CliError(
                f"--tasks {spec}: {place}: task {task.id!r} has neither a question nor a start tape"
            )
    return tasks


def _scorers(specs: list[str]) -> dict[str, Any]:
    from tapekit._loading import load_object
    from tapekit.evaluate import contains_answer, exact_answer

    built_in = {"exact": exact_answer, "contains": contains_answer}

    named: dict[str, Any] = {}
    for item in specs or ["contains"]:
        name, sep, spec = item.partition("=")
        if not sep:
            name, spec = item.split(":")[-1] if ":" in item else item, item
        if not name:
            raise CliError(f"--scorer {item}: the scorer's name is empty; give NAME=SPEC")
        if name in named:
            raise CliError(f"--scorer {item}: two scorers are named {name!r}; name them NAME=SPEC")
        if spec in built_in:
            named[name] = built_in[spec]
            continue
        project_on_path()
        try:
            fn = load_object(spec)
        except ValueError as e:
            raise CliError(f"--scorer {item}: {e} (or one of {', '.join(BUILT_IN)})") from None
        if not callable(fn):
            raise CliError(f"--scorer {item}: {spec} is not a function (tape, task) -> Score")
        named[name] = fn
    return named


class _Counts:
    """The attempts scored so far, for the progress line: passed and failed by the primary
    scorer, how many ended with an error, and the rate (up to the last one scored)."""

    def __init__(self, primary: str) -> None:
        self.primary = primary
        self.done = self.passed = self.errors = 0
        self.t0 = self.last = time.monotonic()

    def add(self, record: SampleResult) -> None:
        """Count one scored attempt."""
        self.done += 1
        self.passed += record.scores[self.primary].passed
        self.errors += record.error is not None
        self.last = time.monotonic()

    def text(self) -> str:
        """The counters as rich markup."""
        per_s = self.done / max(self.last - self.t0, 1e-9)
        rate = (
            f"{per_s:,.2f} attempts/s" if per_s >= 1 or not self.done else f"{per_s * 60:,.2f} attempts/min"
        )
        errors = f" ({self.errors} errors)" if self.errors else ""
        return f"[green]{self.passed} passed[/] [red]{self.done - self.passed} failed[/]{errors} · {rate}"


def eval_command(
    target: Annotated[str, typer.Argument(help="module:attr giving an Agent or (agent, environment)")],
    tasks: Annotated[str, typer.Option("--tasks", help="a .jsonl file of tasks, or module:attr")],
    scorer: Annotated[
        list[str] | None,
        typer.Option("--scorer", help="exact, contains or module:attr, as NAME=SPEC to name it; repeatable"),
    ] = None,
    k: Annotated[int, typer.Option("-k", help="attempts per task (pass@k, pass^k)")] = 1,
    db: Annotated[str | None, typer.Option("--db", help="store every attempt's tape here")] = None,
    name: Annotated[str, typer.Option("--name", help="the evaluation's name (resumes in --db)")] = "eval",
    out: Annotated[Path | None, typer.Option("--out", help="write the report as JSON")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="attempts running at once")] = 8,
    max_loops: Annotated[int, typer.Option("--max-loops", help="agent/environment rounds")] = 50,
    seed: Annotated[int, typer.Option("--seed", help="seed of the bootstrap intervals")] = 0,
    environment_retries: Annotated[
        int,
        typer.Option(
            "--environment-retries",
            help="run an attempt the environment failed (a hung page) again, this often",
        ),
    ] = 0,
) -> None:
    """Evaluate an agent: k attempts of every task, each final tape scored, the report printed.

    The first scorer is the primary one. Every input is checked before anything runs or is
    created (the --db store included): the tasks (UTF-8, ids distinct), the scorers, the target
    and that --out can be written. On a terminal a live line shows the attempts done, passed
    and failed, the rate and the time left.

    Exit code: 0, or 2 on bad input.

    Examples:

    $ tapekit eval tapekit.testing.analyst:team --tasks tapekit.testing.analyst:TASKS --scorer contains -k 2

    $ tapekit eval tapekit.testing.analyst:team --tasks tapekit.testing.analyst:TASKS --db e.db --out r.json
    """
    try:
        if k < 1 or concurrency < 1:
            raise CliError("-k and --concurrency must be at least 1")
        if environment_retries < 0:
            raise CliError(f"--environment-retries must be at least 0, got {environment_retries}")
        if out is not None:
            check_writable(out, "--out")
        task_list = _tasks(tasks)
        scorers = _scorers(list(scorer or []))
        agent, environment = load_target(target)
        store = open_cli_store(db) if db else None  # the last check: it creates the SQLite file
    except CliError as e:
        raise fail(str(e)) from None
    from rich.console import Console

    from tapekit._cli.progress import live_progress
    from tapekit.evaluate import evaluate

    counts = _Counts(next(iter(scorers)))
    try:
        with live_progress(Console(stderr=True), name, len(task_list) * k, counts.text) as update:

            def on_sample(record: SampleResult) -> None:
                counts.add(record)
                update(counts.done)

            report = evaluate(
                agent,
                environment,
                task_list,
                scorers,
                k=k,
                name=name,
                store=store,
                seed=seed,
                max_concurrency=concurrency,
                max_loops=max_loops,
                environment_retries=environment_retries,
                on_sample=on_sample,
            )
    finally:
        if store is not None:
            store.close()
    report.print()
    if report.n_environment_failures:
        typer.echo(
            f"{report.n_environment_failures} attempts ended by the environment's failure (scored as they "
            "are; --environment-retries runs them again)"
        )
    if out is not None:
        try:
            report.save(out)
        except OSError as e:  # checked before the run; the folder went away since
            raise fail(f"cannot write the report to {out}: {e.strerror or e}", code=1) from None
        typer.echo(f"report written to {out}")
