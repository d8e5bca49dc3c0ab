"""``tapekit eval``: an agent over a task set, k attempts per task, scored, and the report.

Tasks come from a JSONL file (one :class:`~tapekit.evaluate.Task` per line: ``id``,
``question`` or ``start``, ``expected``, ``category``, ``metadata``) or from a ``module:attr``
naming a list of tasks (or a function returning one). Scorers are ``exact`` and ``contains``
(built in) or any ``module:attr`` function ``(tape, task) -> Score``, each optionally named as
``NAME=SPEC``. Only typer is imported with this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tapekit._cli.common import CliError, fail, load_target, project_on_path

if TYPE_CHECKING:
    from tapekit.evaluate import Task

__all__ = ["eval_command"]

BUILT_IN = ("exact", "contains")


def _tasks(spec: str) -> list[Task]:
    from pydantic import ValidationError

    from tapekit._loading import load_object
    from tapekit.evaluate import Task

    path = Path(spec)
    if path.suffix in (".jsonl", ".json") or path.exists():
        if not path.is_file():
            raise CliError(f"--tasks {spec}: no such file")
        tasks = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.model_validate_json(line))
            except ValidationError as e:
                raise CliError(f"{spec}, line {n}: not a task: {e.errors()[0]['msg']}") from None
        if not tasks:
            raise CliError(f"--tasks {spec}: the file holds no task")
        return tasks
    project_on_path()
    try:
        obj: Any = load_object(spec)
    except ValueError as e:
        raise CliError(f"--tasks {spec}: {e} (a .jsonl file or module:attr)") from None
    if callable(obj):
        obj = obj()
    if not isinstance(obj, list | tuple) or not obj or not all(isinstance(t, Task) for t in obj):
        raise CliError(f"--tasks {spec}: must give a non-empty list of tapekit.evaluate.Task")
    return list(obj)


def _scorers(specs: list[str]) -> dict[str, Any]:
    from tapekit._loading import load_object
    from tapekit.evaluate import contains_answer, exact_answer

    built_in = {"exact": exact_answer, "contains": contains_answer}

    named: dict[str, Any] = {}
    for item in specs or ["contains"]:
        name, sep, spec = item.partition("=")
        if not sep:
            name, spec = item.split(":")[-1] if ":" in item else item, item
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
        if name in named:
            raise CliError(f"--scorer {item}: two scorers are named {name!r}; name them NAME=SPEC")
        named[name] = fn
    return named


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

    The first scorer is the primary one. Exit code: 0, or 2 on bad input.

    Examples:

    $ tapekit eval tapekit.testing.analyst:team --tasks tapekit.testing.analyst:TASKS --scorer contains -k 2

    $ tapekit eval tapekit.testing.analyst:team --tasks tapekit.testing.analyst:TASKS --db e.db --out r.json
    """
    try:
        agent, environment = load_target(target)
        task_list = _tasks(tasks)
        scorers = _scorers(list(scorer or []))
        if k < 1 or concurrency < 1:
            raise CliError("-k and --concurrency must be at least 1")
        if environment_retries < 0:
            raise CliError(f"--environment-retries must be at least 0, got {environment_retries}")
    except CliError as e:
        raise fail(str(e)) from None
    from tapekit.evaluate import evaluate
    from tapekit.store import open_store

    store = open_store(db) if db else None
    try:
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
        report.save(out)
        typer.echo(f"report written to {out}")
