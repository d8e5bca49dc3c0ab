"""The ``tapekit`` command line: run, replay, chat, batch, eval, train, import, export and the Studio.

The commands live in the private :mod:`tapekit._cli` package; this module assembles the typer
app (``python -m tapekit.cli`` works as ``tapekit``).

Each command imports its heavy parts (web stack, Ray) only when it runs, so ``tapekit --help``
stays fast and the core install stays small.
"""

from __future__ import annotations

from typing import Any

import typer

app = typer.Typer(
    name="tapekit",
    help="Build, debug, evaluate and optimise LLM agents around the tape.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _main() -> None:
    """tapekit: tapes, agents, batches and the Studio."""


from tapekit._cli.batch import batch_command  # noqa: E402  (typer only; the rest loads when it runs)

app.command("batch")(batch_command)

from tapekit._cli.chat import chat_command  # noqa: E402
from tapekit._cli.io import export_command, import_app  # noqa: E402
from tapekit._cli.run import replay_command, run_command  # noqa: E402

app.command("run")(run_command)
app.command("replay")(replay_command)
app.command("chat")(chat_command)
app.command("export")(export_command)
app.add_typer(import_app, name="import")
from tapekit._cli.eval import eval_command  # noqa: E402

app.command("eval")(eval_command)
from tapekit._cli.train import train_app  # noqa: E402  (typer only; trainers load when run)

app.add_typer(train_app, name="train")


@app.command("studio")
def studio_command(
    db: str = typer.Option(..., "--db", help="the tape store: an SQLite file or a postgresql:// URL"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind; any but loopback needs a token"),
    port: int = typer.Option(8765, "--port", help="port to listen on"),
    token: str = typer.Option(
        "", "--token", envvar="TAPEKIT_STUDIO_TOKEN", help="access token (made and printed if needed)"
    ),
    agent: list[str] = typer.Option(  # noqa: B008
        [], "--agent", help="module:attr returning an Agent or (agent, environment); repeatable"
    ),
    imports: list[str] = typer.Option(  # noqa: B008
        [], "--import", help="a module defining step classes of the stored tapes; repeatable"
    ),
    create: bool = typer.Option(
        False, "--create", metavar="", help="create the SQLite file if it does not exist"
    ),
) -> None:
    """Browse, diff, edit and resume the tapes of a store in your browser (the Studio)."""
    from tapekit._cli.common import project_on_path

    project_on_path()  # so that --agent finds the project's own modules
    try:
        from tapekit.studio import serve
    except ImportError as e:
        typer.echo(f"error: the Studio needs the studio extra (pip install 'tapekit[studio]'): {e}", err=True)
        raise typer.Exit(2) from None
    try:
        serve(db, host=host, port=port, token=token or None, agents=agent, create=create, imports=imports)
    except (ValueError, TypeError, OSError, ConnectionError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def command() -> Any:
    """The click command behind ``app``, with the type column left empty for flags: typer
    shows ``<bool>`` beside ``--json`` or ``--help``, which take no value. (``--create`` and
    ``--retry-failed`` also say ``metavar=""`` themselves, so that ``app`` invoked directly, as
    typer's test runner does, shows them without a type too.) (Typer may vendor its
    own click, so the walk reads attributes rather than checking click's classes.)"""
    root = typer.main.get_command(app)
    todo: list[Any] = [root]
    while todo:
        cmd = todo.pop()
        help_option = cmd.get_help_option(cmd.context_class(cmd, info_name=cmd.name))
        for param in [*cmd.params, *([help_option] if help_option is not None else [])]:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        todo.extend(getattr(cmd, "commands", {}).values())
    return root


def main() -> None:
    """The ``tapekit`` console script (and ``python -m tapekit.cli``)."""
    command()()


if __name__ == "__main__":
    main()
