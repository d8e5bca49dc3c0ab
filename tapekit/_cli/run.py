"""``tapekit run`` (an agent on a question or a tape, printing the tape) and ``tapekit replay``
(check that an agent still makes a recorded tape). Only typer is imported with this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tapekit._cli.common import (
    CliError,
    check_writable,
    fail,
    load_target,
    open_cli_store,
    pick_tape,
    read_tape_file,
)


def run_command(
    target: Annotated[str, typer.Argument(help="module:attr giving an Agent or (agent, environment)")],
    question: Annotated[str | None, typer.Argument(help="the user's message to start from")] = None,
    tape: Annotated[
        Path | None, typer.Option("--tape", help="start from this JSON tape file instead of a question")
    ] = None,
    db: Annotated[str | None, typer.Option("--db", help="store the tape and LLM calls here")] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="also write the final tape to this JSON file")
    ] = None,
    max_loops: Annotated[int, typer.Option("--max-loops", help="agent/environment rounds")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="print the tape as JSON, not as text")] = False,
) -> None:
    """Run an agent on a question (or a tape file) until it is done or waits, and print the tape.

    Exit code: 0, or 1 if the tape ends with an error.

    Examples:

    $ tapekit run tapekit.testing.analyst:team "Tell me about Vulcan in 3 sentences"

    $ tapekit run tapekit.testing.analyst:team "Tell me about Acme" --db demo.db --out acme.json

    $ tapekit run tapekit.testing.analyst:team --tape acme.json --json
    """
    try:
        code = _run(target, question, tape, db, out, max_loops, as_json)
    except CliError as e:
        raise fail(str(e)) from None
    raise typer.Exit(code)


def _run(
    target: str,
    question: str | None,
    tape_file: Path | None,
    db: str | None,
    out: Path | None,
    max_loops: int,
    as_json: bool,
) -> int:
    from tapekit.core import Tape
    from tapekit.dialog import UserStep
    from tapekit.llm.base import LLMCall
    from tapekit.orchestrator import main_loop
    from tapekit.rendering import render_tape

    if (question is None) == (tape_file is None):
        raise CliError("give either a QUESTION or --tape FILE")
    if out is not None:
        check_writable(out, "--out")
    start = (
        read_tape_file(tape_file) if tape_file is not None else Tape(steps=[UserStep(content=question or "")])
    )
    agent, environment = load_target(target)
    calls: dict[str, LLMCall] = {}
    final = start
    store = open_cli_store(db) if db else None
    try:
        tags = ["run"] if store is not None else []
        loop = main_loop(agent, start, environment, max_loops, store=store, tags=tags)
        for event in loop:
            if event.agent_event is not None and event.agent_event.llm_call is not None:
                calls[event.agent_event.llm_call.prompt.id] = event.agent_event.llm_call
            if event.tape is not None:
                final = event.tape
    finally:
        if store is not None:
            store.close()
    if as_json:
        typer.echo(final.model_dump_json(indent=2))
    else:
        typer.echo(render_tape(final, llm_calls=calls))
    if db:
        typer.echo(f"stored as tape {start.metadata.id} in {db} ({len(calls)} LLM calls)", err=True)
    if out is not None:
        try:
            out.write_text(final.model_dump_json(indent=2), encoding="utf-8")
        except OSError as e:  # checked before the run; the folder went away since
            typer.echo(f"error: cannot write the tape to {out}: {e.strerror or e}", err=True)
            return 1
    return 1 if final.metadata.error else 0


def replay_command(
    target: Annotated[str, typer.Argument(help="module:attr giving an Agent or (agent, environment)")],
    tape: Annotated[
        str, typer.Argument(help="a JSON tape file, or with --db a tape id, 'latest' or a prefix")
    ],
    db: Annotated[
        str | None, typer.Option("--db", help="read the tape and its recorded LLM calls from this store")
    ] = None,
) -> None:
    """Replay a recorded tape against an agent: the LLM answers only with the recorded calls, the
    environment with the recorded observations; print the diff where the agent diverges.

    Without --db the LLM calls are rebuilt from the tape with each node's make_llm_output.

    Exit code: 0 if the agent makes the same tape, 1 if it diverges.

    Examples:

    $ tapekit run tapekit.testing.analyst:team "Tell me about Vulcan" --db demo.db --out vulcan.json

    $ tapekit replay tapekit.testing.analyst:team latest --db demo.db

    $ tapekit replay tapekit.testing.analyst:team vulcan.json
    """
    try:
        code = _replay(target, tape, db)
    except CliError as e:
        raise fail(str(e)) from None
    raise typer.Exit(code)


def _replay(target: str, tape_arg: str, db: str | None) -> int:
    from tapekit.llm.base import LLMCall
    from tapekit.orchestrator import replay_tape

    agent, _ = load_target(target)
    calls: list[LLMCall] | None = None
    if db:
        with open_cli_store(db, existing=True) as store:
            recorded = store.get_tape(pick_tape(store, tape_arg))
            pids = dict.fromkeys(s.metadata.prompt_id for s in recorded.steps if s.metadata.prompt_id)
            found = [store.get_llm_call(pid) for pid in pids]
            calls = [c for c in found if c is not None]
    else:
        recorded = read_tape_file(Path(tape_arg))
    result = replay_tape(agent, recorded, llm_calls=calls)
    if result.ok:
        typer.echo(f"replay ok: {target} made the same {len(recorded)} steps")
        return 0
    typer.echo(f"replay diverged at step {result.first_divergence}")
    if result.error:
        typer.echo(f"error: {result.error}")
    typer.echo(result.diff)
    return 1
