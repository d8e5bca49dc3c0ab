"""The cgroups v1 of one run, where the host lets us make them: ``pids`` bounds the process
tree's size (which ``RLIMIT_NPROC`` cannot do for root), ``memory`` the whole tree's memory (the
kernel kills a process over it, and the run is stopped). Where none can be made the sandbox falls
back on rlimits and a watchdog (``_process.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

from tapekit.sandbox._limits import SandboxLimits

CGROUP_V1 = Path("/sys/fs/cgroup")


class Cgroups:
    """A pids and a memory cgroup v1 for one run, where the host lets us make them: in the caller's
    own cgroup of each controller when it can be found, else at the top of the hierarchy."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @classmethod
    def make(cls, limits: SandboxLimits) -> Cgroups | None:
        name = f"tapekit-sbx-{uuid.uuid4().hex[:12]}"
        made: dict[str, Path] = {}
        memory = str(limits.memory_mb * 1024 * 1024)
        settings: dict[str, dict[str, str]] = {
            "pids": {"pids.max": str(limits.max_processes)},
            # with swap, memsw (memory + swap) is what bounds the tree; without, it is not there
            "memory": {
                "memory.limit_in_bytes": memory,
                "memory.memsw.limit_in_bytes": memory,
                "memory.swappiness": "0",
            },
        }
        for controller, values in settings.items():
            base = own_cgroup(controller)
            if base is None:
                continue
            try:
                path = base / name
                path.mkdir()
                made[controller] = path
                for key, value in values.items():
                    with contextlib.suppress(OSError):
                        (path / key).write_text(value)
            except OSError:
                continue
        cgroups = cls(made) if made else None
        if cgroups and "memory" in made and not cgroups._memory_set(int(memory)):
            with contextlib.suppress(OSError):  # no limit after all: the watchdog will bound the tree
                made.pop("memory").rmdir()
        return cgroups if cgroups and cgroups.dirs else None

    def _memory_set(self, limit: int) -> bool:
        """Whether the memory cgroup holds the tree to ``limit`` and tells when it killed."""
        path = self.dirs["memory"]
        try:
            return (
                int((path / "memory.limit_in_bytes").read_text()) == limit
                and "oom_kill " in (path / "memory.oom_control").read_text()
            )
        except (OSError, ValueError):
            return False

    @property
    def bounds_memory(self) -> bool:
        """True when a memory cgroup bounds the tree (else the watchdog does)."""
        return "memory" in self.dirs

    def join(self, pid: int) -> None:
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                (path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                found.update(int(x) for x in (path / "cgroup.procs").read_text().split())
        return sorted(found)

    def pids_limited(self) -> bool:
        path = self.dirs.get("pids")
        if path is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            events = (path / "pids.events").read_text().split()
            return int(events[events.index("max") + 1]) > 0
        return False

    def oom_kills(self) -> int:
        """How many processes the memory cgroup's limit has killed (0 without a memory cgroup)."""
        path = self.dirs.get("memory")
        if path is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            fields = (path / "memory.oom_control").read_text().split()
            return int(fields[fields.index("oom_kill") + 1])
        return 0

    def kill_all(self) -> None:
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for path in self.dirs.values():
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)


def own_cgroup(controller: str) -> Path | None:
    """The folder of this process's cgroup v1 for ``controller`` (where the sandbox's is made, so
    that the limits above ours still hold), the hierarchy's top if that is not visible, or None
    when the controller is not mounted as cgroup v1."""
    mount = CGROUP_V1 / controller
    if not (mount / "cgroup.procs").exists():
        return None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                own = mount / path.lstrip("/")
                if (own / "cgroup.procs").exists():
                    return own
    return mount
