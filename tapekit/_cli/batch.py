"""``tapekit batch``: run an agent over a JSONL file of tapes with a live progress display
(:func:`tapekit._cli.progress.live_progress`, shown on a terminal only).

Only typer is imported with this module (``tapekit --help`` stays fast); tapekit's batch
machinery, rich, the store and Ray are imported when the command runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from tapekit.batch import BatchOptions, BatchResult, BatchStats
    from tapekit.core import Tape
    from tapekit.store import TapeStore


EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def read_tapes(path: Path, tape_class: type[Tape[Any, Any]]) -> list[Tape[Any, Any]]:
    """The tapes in ``path``, one JSON tape per line (blank lines skipped).

    A line without ``metadata.id`` gets an id derived from its content, so that running the
    same file again finds the same stored tapes. Errors name the line.
    """
    from pydantic import ValidationError

    from tapekit.store._jsonl import read_jsonl_lines

    tapes = []
    first_line: dict[str, int] = {}
    for number, line, data in read_jsonl_lines(path):
        if not isinstance(data, dict):
            raise ValueError(f"{path}, line {number}: a tape must be a JSON object")
        meta = data.get("metadata")
        if meta is None or (isinstance(meta, dict) and not meta.get("id")):
            digest = hashlib.sha256(line.strip().encode()).hexdigest()[:32]
            data["metadata"] = {**(meta or {}), "id": digest}
        try:
            tape = tape_class.model_validate(data)
        except ValidationError as e:
            raise ValueError(f"{path}, line {number}: not a valid tape: {e}") from e
        except RecursionError:
            raise ValueError(f"{path}, line {number}: the tape is nested too deeply to read") from None
        tape_id = tape.metadata.id
        if tape_id in first_line:
            raise ValueError(
                f"{path}, lines {first_line[tape_id]} and {number} are the same tape (id {tape_id}); "
                "give repeated tasks distinct metadata.id values"
            )
        first_line[tape_id] = number
        tapes.append(tape)
    if not tapes:
        raise ValueError(f"{path} holds no tapes")
    return tapes


def _default_name(target: str, tapes: Path) -> str:
    return re.sub(r"[^\w.\-/]", ".", f"{target}-{tapes.stem}")


def _progress_text(stats: BatchStats) -> str:
    return (
        f"[green]{stats.finished - stats.failed} ok[/] [red]{stats.failed} failed[/] "
        f"[cyan]{stats.running} running[/] {stats.skipped} skipped · "
        f"{stats.llm_calls_per_s:,.1f} LLM calls/s · {stats.tokens_per_s:,.0f} tokens/s"
    )


def batch_command(
    target: Annotated[str, typer.Argument(help="module:attr of a function returning (agent, environment)")],
    tapes: Annotated[Path, typer.Option("--tapes", help="JSONL file: one start tape per line")],
    db: Annotated[str, typer.Option("--db", help="SQLite file or postgresql:// URL")] = "tapekit.db",
    concurrency: Annotated[int, typer.Option("--concurrency", help="tapes running at once")] = 64,
    llm_concurrency: Annotated[
        int | None, typer.Option("--llm-concurrency", help="requests in flight per LLM (default: no limit)")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="batch name (default: from TARGET and the tapes file)")
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="local or ray")] = "local",
    max_loops: Annotated[
        int | None, typer.Option("--max-loops", help="agent/environment rounds per tape")
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", metavar="", help="run the tapes that failed last time again")
    ] = False,
    tape_class: Annotated[
        str | None, typer.Option("--tape-class", help="module:attr of the tape class (default: Tape)")
    ] = None,
    ray_workers: Annotated[
        int | None, typer.Option("--ray-workers", help="Ray tasks (default: the cluster's CPUs)")
    ] = None,
) -> None:
    """Run TARGET's agent on every tape in --tapes, storing each tape in --db as it runs.

    Run the same command again to skip the finished tapes and resume the others.

    Exit code: 0 if every tape finished without error, 1 if any failed, 130 if interrupted.
    """
    from rich.console import Console

    from tapekit._cli.common import project_on_path

    console = Console(stderr=True, soft_wrap=True)  # a summary line stays one line in a log
    project_on_path()  # TARGET may be the project's own module
    try:
        from tapekit.batch import BatchOptions, BatchStats, load_factory, load_object
        from tapekit.core import Tape

        if backend not in ("local", "ray"):
            raise ValueError(f"--backend {backend!r}: choose local or ray")
        cls = load_object(tape_class) if tape_class else Tape
        if not (isinstance(cls, type) and issubclass(cls, Tape)):
            raise ValueError(f"--tape-class {tape_class!r} is not a Tape class")
        agent, environment = load_factory(target)
        start_tapes = read_tapes(tapes, cls)
    except (ValueError, TypeError, OSError) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    from tapekit.store import open_store

    batch_name = name or _default_name(target, tapes)
    stats = BatchStats()
    failures: list[BatchResult] = []
    try:
        store = open_store(db)
    except (ValueError, ConnectionError, ImportError) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    interrupted = False
    with store:
        try:
            asyncio.run(
                _run(
                    agent,
                    environment,
                    start_tapes,
                    store,
                    stats,
                    failures,
                    console,
                    BatchOptions(
                        max_concurrency=concurrency,
                        llm_concurrency=llm_concurrency,
                        name=batch_name,
                        max_loops=max_loops,
                        retry_failed=retry_failed,
                        backend=backend,  # type: ignore[typeddict-item]  # checked above
                        ray_workers=ray_workers,
                        ray_factory=target if backend == "ray" else None,
                    ),
                )
            )
        except KeyboardInterrupt:
            interrupted = True
        except (ValueError, TypeError) as e:
            console.print(f"[red]error:[/] {e}")
            raise typer.Exit(2) from None
    _summary(console, stats, failures, batch_name, db)
    if interrupted:
        console.print(
            f"[yellow]interrupted:[/] {stats.finished} of {stats.total} tapes finished and are saved in "
            f"{db}; the others are saved as far as they got. Run the same command again to resume them."
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    if stats.failed:
        raise typer.Exit(EXIT_FAILED)


async def _run(
    agent: Any,
    environment: Any,
    start_tapes: list[Any],
    store: TapeStore,
    stats: BatchStats,
    failures: list[BatchResult],
    console: Any,
    options: BatchOptions,
) -> None:
    from tapekit._cli.progress import live_progress
    from tapekit.batch import abatch

    everything: BatchOptions = {**options, "store": store, "stats": stats}
    results = abatch(agent, environment, start_tapes, **everything)
    with live_progress(console, options["name"], len(start_tapes), lambda: _progress_text(stats)) as update:
        async for result in results:
            if not result.ok:
                failures.append(result)
            update(stats.finished)


def _summary(console: Any, stats: BatchStats, failures: list[BatchResult], name: str, db: str) -> None:
    console.print(
        f"batch [bold]{name}[/]: {stats.finished} of {stats.total} finished ({stats.failed} failed, "
        f"{stats.skipped} already done, {stats.resumed} resumed) in {stats.elapsed_s:.1f} s; "
        f"{stats.llm_calls} LLM calls ({stats.llm_calls_per_s:,.1f}/s), "
        f"{stats.prompt_tokens + stats.output_tokens:,} tokens ({stats.tokens_per_s:,.0f}/s); stored in {db}"
    )
    for result in sorted(failures, key=lambda r: r.index)[:10]:
        console.print(f"  [red]failed[/] #{result.index} (tape {result.start_id}): {result.error}")
    if len(failures) > 10:
        console.print(f"  … and {len(failures) - 10} more (tag batch:{name}:failed in the store)")
