"""What one sandboxed run may use (:class:`SandboxLimits`), how it ended
(:class:`SandboxResult`), and which limit explains an ending the kernel reports only as an exit
status or a message.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. ``wall_s`` is real time; ``cpu_s`` CPU seconds of the main process;
    ``memory_mb`` the memory of the whole process tree (a cgroup, else a watchdog: see
    :mod:`tapekit.sandbox`) and the address space of each process;
    ``max_processes`` processes and threads at once; ``max_output_bytes`` of stdout and of
    stderr kept (the rest is cut and said so); ``max_file_mb`` the largest file it may write."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    max_processes: int = 32
    max_output_bytes: int = 64_000
    max_file_mb: int = 64
    max_open_files: int = 256

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_processes", "max_output_bytes", "max_file_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass
class SandboxResult:
    """How a run ended. ``stopped_by`` names the limit that stopped it ("wall time", "cpu time",
    "memory", "processes", "file size", "output") or is None; "memory" is either a process's
    ``MemoryError`` (its address space) or the whole tree over ``memory_mb``, after which the run
    was killed. ``files`` lists what the code left in its working directory (relative paths)."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    stopped_by: str | None = None
    files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the code exited with status 0 and no limit stopped it."""
        return self.exit_code == 0 and self.stopped_by is None

    def to_observation(self) -> str:
        """The run as text for the agent: the limit that stopped it, the exit status, the output."""
        parts = []
        if self.stopped_by:
            parts.append(f"stopped: the {self.stopped_by} limit was exceeded")
        parts.append(f"exit code: {self.exit_code}")
        if self.stdout:
            parts.append(f"stdout:\n{self.stdout}")
        if self.stderr:
            parts.append(f"stderr:\n{self.stderr}")
        if self.files:
            parts.append("files: " + ", ".join(self.files))
        return "\n".join(parts)


def limit_hit(code: int, stderr: str, pids_limited: bool) -> str | None:
    """Which limit (if any) explains how the run ended."""
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (
        code in (-signal.SIGKILL, 137) and "cpu" in stderr.lower()
    ):
        return "cpu time"
    if code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) or "File too large" in stderr:
        return "file size"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    if pids_limited or "Resource temporarily unavailable" in stderr:
        return "processes"
    return None  # the tree's memory limit is told by its cgroup or its watchdog, not guessed here
