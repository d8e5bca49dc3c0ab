"""The ``tapekit`` command line: ``tapekit studio`` (browse, diff, edit and resume tapes) and
``tapekit batch`` (run an agent over many tapes with a progress bar).

Each command imports its heavy parts (web stack, Ray) only when it runs, so ``tapekit --help``
stays fast and the core install stays small.
"""

from __future__ import annotations

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


from tapekit._batch_cli import batch_command  # noqa: E402  (typer only; the rest loads when it runs)

app.command("batch")(batch_command)


if __name__ == "__main__":
    app()
