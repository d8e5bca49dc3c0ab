"""The confined process tree at run time: the rlimits set in the child before it execs, its
output read with a cap, its memory watched (the memory cgroup's kills, else a watchdog summing
the tree's ``Pss``), and the tree killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal

from tapekit.sandbox._cgroups import Cgroups
from tapekit.sandbox._limits import SandboxLimits

CGROUP_POLL_S = 0.05  # how often the run's memory cgroup is asked whether it killed something
WATCHDOG_POLL_S = 0.1  # how often the watchdog sums the tree's memory (no memory cgroup)
PAGE = os.sysconf("SC_PAGE_SIZE")


def limit_child(limits: SandboxLimits, cgroups: Cgroups | None) -> None:
    """Runs in the child between fork and exec: join the cgroups and set the rlimits."""
    if cgroups is not None:
        cgroups.join(os.getpid())
    mem = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    size = limits.max_file_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.getuid() != 0:  # root ignores RLIMIT_NPROC; the pids cgroup covers it there
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))


async def read_capped(proc: asyncio.subprocess.Process, cap: int) -> tuple[bytes, bytes, bool]:
    """Read stdout and stderr to the end, keeping at most ``cap`` bytes of each; stop the process
    (and report it) when it writes much more than that."""
    cut = False

    async def drain(stream: asyncio.StreamReader | None) -> bytes:
        nonlocal cut
        kept = bytearray()
        seen = 0
        while stream is not None:
            piece = await stream.read(65536)
            if not piece:
                break
            seen += len(piece)
            room = cap - len(kept)
            if room > 0:
                kept += piece[:room]
            if seen > 16 * cap and not cut:  # flooding: stop it rather than read forever
                cut = True
                kill_group(proc.pid)
            # and read on to the end: a pipe left unread is never closed, and asyncio reports the
            # exit (proc.wait()) only once both pipes are
        if seen > cap:
            kept += f"\n[... {seen - cap} more bytes cut]".encode()
        return bytes(kept)

    out, err = await asyncio.gather(drain(proc.stdout), drain(proc.stderr))
    await proc.wait()
    return out, err, cut


async def watch_memory(pid: int, cgroups: Cgroups | None, limit: int) -> None:
    """Return, having killed the run, once its process tree is over ``limit`` bytes: the memory
    cgroup killed a process (it holds the tree to the limit), or, without one, the tree's summed
    memory is over it. Runs until cancelled otherwise."""
    if cgroups is not None and cgroups.bounds_memory:
        while cgroups.oom_kills() == 0:
            await asyncio.sleep(CGROUP_POLL_S)
    else:
        while tree_memory(pid) <= limit:
            await asyncio.sleep(WATCHDOG_POLL_S)
    kill_tree(pid, cgroups)


def tree_memory(root: int) -> int:
    """Bytes of memory used by ``root`` and all its descendants (their Pss, else their RSS)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # the name may hold spaces and ")"
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += process_memory(pid)
        todo.extend(children.get(pid, ()))
    return total


def process_memory(pid: int) -> int:
    """The proportional set size of a process (shared pages split among their sharers, so a tree
    of forks is not counted several times), else its resident set size, in bytes; 0 if gone."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE
    return 0


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def kill_tree(pid: int, cgroups: Cgroups | None) -> None:
    """Kill bwrap's session (its PID namespace dies with it) and anything left in the cgroup."""
    kill_group(pid)
    if cgroups is not None:
        cgroups.kill_all()
