"""Finding and killing a browser's processes through ``/proc`` (Linux), the last resort when a
browser does not close: its main process is found by a marker switch on its command line, and it
goes with every process below it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def _ppids() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir() if _PROC.exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, ...)."""
    parents = _ppids()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    out: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            out.append(child)
            stack.append(child)
    return out


def find_marked(marker: str) -> int | None:
    """The pid of the process whose command line holds ``marker`` (None if there is none)."""
    for entry in _PROC.iterdir() if _PROC.exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and alive(int(entry.name)):
            return int(entry.name)
    return None


def parent(pid: int) -> int | None:
    """The parent of ``pid`` (None if it is gone)."""
    return _ppids().get(pid)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process below it; the pids signalled."""
    targets = [pid, *descendants(pid)]
    for target in targets:
        with contextlib.suppress(OSError):
            os.kill(target, signal.SIGKILL)
    return targets
