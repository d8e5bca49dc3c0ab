"""``tapekit export`` (a store's tapes as JSONL, or as OTLP spans) and ``tapekit import`` (a JSONL
export, or the reference TapeAgents package's files). Only typer is imported with this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tapekit._cli.common import CliError, check_writable, fail, open_cli_store, pick_tape

import_app = typer.Typer(
    help="Load tapes into a store: a tapekit JSONL export, or the reference TapeAgents package's files.",
    no_args_is_help=True,
)


def export_command(
    db: Annotated[str, typer.Option("--db", help="the tape store: an SQLite file or a postgresql:// URL")],
    out: Annotated[Path | None, typer.Option("--out", help="the file to write")] = None,
    tape: Annotated[
        list[str] | None,
        typer.Option("--tape", help="a tape id, prefix or 'latest' (repeatable; default: all)"),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="jsonl (tapes and LLM calls) or otlp (GenAI spans)")
    ] = "jsonl",
    llm_calls: Annotated[
        bool, typer.Option("--llm-calls/--no-llm-calls", help="jsonl: include the LLM calls")
    ] = True,
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", help="otlp: send the spans to this OTLP/HTTP traces URL, not to a file"),
    ] = None,
) -> None:
    """Export tapes (all, or --tape ones) with their LLM calls.

    jsonl writes one JSON object per line (tapes with metadata and tags, then LLM calls): read
    it back with 'tapekit import jsonl'. otlp writes the tapes as OpenTelemetry GenAI spans in
    OTLP JSON to --out, or sends them to a collector at --endpoint with the OTLP/HTTP exporter
    (needs the otel extra).

    Examples:

    $ tapekit run tapekit.testing.analyst:team "Tell me about Vulcan in 3 sentences" --db demo.db

    $ tapekit export --db demo.db --out tapes.jsonl

    $ tapekit export --db demo.db --out latest.jsonl --tape latest --no-llm-calls

    $ tapekit export --db demo.db --format otlp --out spans.json
    """
    try:
        _export(db, out, tape or [], fmt, llm_calls, endpoint)
    except CliError as e:
        raise fail(str(e)) from None


def _export(
    db: str, out: Path | None, tapes: list[str], fmt: str, llm_calls: bool, endpoint: str | None
) -> None:
    if fmt not in ("jsonl", "otlp"):
        raise CliError(f"--format {fmt!r}: choose jsonl or otlp")
    if fmt == "jsonl" and (out is None or endpoint):
        raise CliError("--format jsonl writes a file: give --out FILE (--endpoint is for otlp)")
    if fmt == "otlp" and (out is None) == (endpoint is None):
        raise CliError("--format otlp: give either --out FILE (OTLP JSON) or --endpoint URL (send the spans)")
    if out is not None:
        check_writable(out, "--out")
    with open_cli_store(db, existing=True) as store:
        ids = [pick_tape(store, t) for t in tapes] or None
        if fmt == "jsonl":
            assert out is not None
            n = store.export_jsonl(out, ids, llm_calls=llm_calls)
            typer.echo(f"wrote {n} tapes to {out}")
            return
        try:
            from tapekit import otel
        except ImportError as e:
            raise CliError(f"--format otlp needs the otel extra (pip install 'tapekit[otel]'): {e}") from None
        try:
            if out is not None:
                n = otel.write_otlp_json(store, out, ids)
                typer.echo(f"wrote {n} tapes as OTLP JSON spans to {out}")
            else:
                n = otel.export_tapes_otlp(store, endpoint, tape_ids=ids)
                typer.echo(f"sent {n} spans to {endpoint}")
        except (ImportError, RuntimeError) as e:
            raise CliError(str(e)) from None


@import_app.command("jsonl")
def import_jsonl_command(
    path: Annotated[Path, typer.Argument(help="a file written by 'tapekit export'")],
    db: Annotated[str, typer.Option("--db", help="the tape store to fill (made if missing)")],
) -> None:
    """Import a tapekit JSONL export into --db, keeping ids, metadata, tags and LLM calls.

    Importing the same file again changes nothing.

    Examples:

    $ tapekit run tapekit.testing.analyst:team "Tell me about Vulcan in 3 sentences" --db demo.db

    $ tapekit export --db demo.db --out tapes.jsonl

    $ tapekit import jsonl tapes.jsonl --db copy.db
    """
    from tapekit.store import open_store

    if not path.is_file():
        raise fail(f"no file {path}")
    try:
        with open_store(db) as store:
            ids = store.import_jsonl(path)
    except ValueError as e:
        raise fail(str(e)) from None
    typer.echo(f"imported {len(ids)} tapes from {path} into {db}")


@import_app.command("reference")
def import_reference_command(
    paths: Annotated[
        list[Path], typer.Argument(help="JSON/YAML tape files, SQLite databases, or folders of them")
    ],
    db: Annotated[str, typer.Option("--db", help="the tape store to fill (made if missing)")],
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="tag the imported tapes (default: tapeagents)")
    ] = None,
) -> None:
    """Import the reference TapeAgents package's files into --db: JSON tape files, YAML tape
    streams, its SQLite database (LLMCalls and Tapes tables), and training-text dumps (parsed
    and checked; the store keeps no training texts).

    Tape, step and prompt ids are kept, so each step links to its LLM call. Steps of kinds
    tapekit has no class for are kept as generic steps with all their fields.

    Examples:

    $ tapekit import reference ../shared/reference-data --db migrated.db

    $ tapekit import reference ../shared/reference-data/tapes --db tapes.db --tag demo
    """
    from tapekit.migrate import ReferenceFormatError, import_reference
    from tapekit.store import open_store

    try:
        with open_store(db) as store:
            report = import_reference(paths, store, tags=tag or ["tapeagents"])
    except (ReferenceFormatError, ValueError) as e:
        raise fail(str(e)) from None
    typer.echo(report.summary())
