"""The live progress display of the long-running commands (``tapekit batch``, ``tapekit eval``):
a bar with done / total, elapsed time, the estimated time left and the command's own counters
(passed, failed, rates), redrawn four times a second.

It is drawn only on a terminal: when the console writes to a file or a pipe (a log, CI, a
test's captured output) nothing is printed, so logs keep only the commands' summary lines.
Only the standard library is imported with this module; rich loads when a display starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


@contextmanager
def live_progress(
    console: Console, description: str, total: int, counters: Callable[[], str]
) -> Iterator[Callable[[int], None]]:
    """Show a live progress line on ``console`` while the block runs; yields ``update(done)``,
    to call with the number of finished items.

    ``counters`` returns the command's counters as rich markup (``"[green]3 passed[/] ..."``);
    it is read at every refresh, so it may read counts that change between updates. When
    ``console`` is not a terminal nothing is shown and ``update`` does nothing."""
    if not console.is_terminal:
        yield lambda done: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class CountersColumn(ProgressColumn):
        """The command's counters, read at every refresh."""

        def render(self, task: Any) -> Text:
            return Text.from_markup(counters())

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        CountersColumn(),
    )
    with Progress(*columns, console=console, refresh_per_second=4) as progress:
        task = progress.add_task(description, total=total)
        yield lambda done: progress.update(task, completed=done)
