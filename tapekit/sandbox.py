"""A sandbox for code the agent writes: no network, bounded CPU, memory, processes and time, and
one temporary working directory as the only writable place.

The isolation is Debian's bubblewrap (``bwrap``): new user, network, PID, IPC and UTS namespaces;
the system and the Python installation mounted read-only; the working directory mounted
read-write at ``/sandbox`` (its ``.tmp`` subfolder is the sandbox's ``/tmp``); everything else,
the sandbox's own root included, read-only. Inside it, resource limits (``setrlimit``) bound
address space, CPU seconds, file size and open files, and a cgroup (``pids`` and ``memory``
controllers, where the host lets us make one) bounds the number of processes and the memory of
the whole tree, which ``RLIMIT_NPROC`` cannot do for root. A wall-clock timeout kills the whole
tree. ``scripts/install-system.sh`` installs bubblewrap; without it :class:`Sandbox` refuses to
run (:class:`SandboxUnavailableError`) instead of running code unconfined.

Typical use, as a tool of a :class:`~tapekit.environment.ToolEnvironment`::

    sandbox = Sandbox(SandboxLimits(wall_s=10, memory_mb=512))
    env = ToolEnvironment([sandbox.python_tool()])
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tapekit.environment import Tool
from tapekit.errors import TapekitError

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailableError"]

_CGROUP_V1 = Path("/sys/fs/cgroup")
_SANDBOX_DIR = "/sandbox"
_SCRATCH = ".tmp"  # the workdir's subfolder mounted as /tmp


class SandboxUnavailableError(TapekitError, RuntimeError):
    """The host cannot confine code (no ``bwrap``, or namespaces are not permitted)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. ``wall_s`` is real time; ``cpu_s`` CPU seconds of the main process;
    ``memory_mb`` address space per process and, with a cgroup, memory of the whole tree;
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
    "memory", "processes", "file size", "output") or is None; ``files`` lists what the code left
    in its working directory (relative paths)."""

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


class Sandbox:
    """Runs code confined (see the module docs). One sandbox keeps one working directory across
    runs (so code can write a file in one run and read it in the next) until :meth:`close`.

    ``workdir``: use this directory instead of a fresh temporary one (it is not deleted).
    ``python``: the interpreter to run (default: this one, with its installed packages visible
    read-only). ``bind_ro``: extra host paths to mount read-only at the same place.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        workdir: str | Path | None = None,
        python: str | None = None,
        bind_ro: tuple[str, ...] = (),
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.python = python or sys.executable
        self.bind_ro = tuple(bind_ro)
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tapekit-sbx-"))
        self.workdir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ public

    @staticmethod
    def available() -> str | None:
        """None when code can be confined here, else why not."""
        if shutil.which("bwrap") is None:
            return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
        return None

    async def arun_python(self, code: str) -> SandboxResult:
        """Run Python ``code`` in the sandbox (the code is written to ``main.py`` in the workdir)."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        name = f".tapekit-{uuid.uuid4().hex[:8]}.py"
        (self.workdir / name).write_text(code, encoding="utf-8", errors="surrogateescape")
        try:
            return await self.arun([self.python, "-I", "-B", f"{_SANDBOX_DIR}/{name}"])
        finally:
            with contextlib.suppress(OSError):
                (self.workdir / name).unlink()

    def run_python(self, code: str) -> SandboxResult:
        """Sync version of :meth:`arun_python`."""
        return asyncio.run(self.arun_python(code))

    async def arun(self, argv: list[str]) -> SandboxResult:
        """Run a command (argv, resolved inside the sandbox) with the sandbox's limits."""
        reason = self.available()
        if reason:
            raise SandboxUnavailableError(f"cannot run code confined: {reason}")
        cgroups = _Cgroups.make(self.limits)
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self._bwrap_argv(argv),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=lambda: _limit_child(self.limits, cgroups),
            start_new_session=True,
        )
        stopped_by = None
        try:
            out, err, cut = await asyncio.wait_for(
                _read_capped(proc, self.limits.max_output_bytes), timeout=self.limits.wall_s
            )
            if cut:
                stopped_by = "output"
        except TimeoutError:
            stopped_by = "wall time"
            out, err = b"", b""
        finally:
            _kill_tree(proc.pid, cgroups)
            with contextlib.suppress(Exception):  # drain and close the pipes of a killed run
                await asyncio.wait_for(proc.communicate(), timeout=5)
            code = await proc.wait()
            peak_pids_hit = cgroups.pids_limited() if cgroups else False
            if cgroups:
                cgroups.remove()
        stdout, stderr = _text(out), _text(err)
        stopped_by = stopped_by or _limit_hit(code, stderr, peak_pids_hit)
        if stderr.startswith("bwrap:"):
            raise SandboxUnavailableError(f"bubblewrap could not start the sandbox: {stderr.strip()}")
        return SandboxResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            duration_s=time.monotonic() - t0,
            stopped_by=stopped_by,
            files=self.files(),
        )

    def files(self) -> list[str]:
        """The files in the working directory (relative paths, sorted; our own scripts left out)."""
        root = self.workdir
        found = [
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".tapekit-") and p.parts[len(root.parts)] != _SCRATCH
        ]
        return sorted(found)

    def python_tool(self, name: str = "run_python") -> Tool:
        """A :class:`~tapekit.environment.Tool` that runs Python code here and answers with the
        run as text (limits hit, exit code, output, files)."""
        sandbox = self

        async def run_python(code: str) -> str:
            """Run Python code in a sandbox without network; print what you want to see.

            Args:
                code: a complete Python program; files it writes stay in its working directory.
            """
            return (await sandbox.arun_python(code)).to_observation()

        return Tool(run_python, name=name)

    def close(self) -> None:
        """Delete the temporary working directory (not one the caller gave)."""
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _bwrap_argv(self, argv: list[str]) -> list[str]:
        args = [
            "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", _SANDBOX_DIR, "--setenv", "TMPDIR", "/tmp",
            "--setenv", "MPLBACKEND", "Agg", "--setenv", "MPLCONFIGDIR", "/tmp",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "LANG", "C.UTF-8",
            "--ro-bind", "/usr", "/usr", "--dev", "/dev", "--proc", "/proc",
        ]  # fmt: skip
        for link in ("bin", "lib", "lib64", "sbin"):
            target = Path("/") / link
            if target.is_symlink():
                args += ["--symlink", os.readlink(target), str(target)]
            elif target.exists():
                args += ["--ro-bind", str(target), str(target)]
        for path in ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ssl", "/etc/fonts", "/etc/localtime"):
            if Path(path).exists():
                args += ["--ro-bind", path, path]
        for path in _python_roots(self.python) + self.bind_ro:
            args += ["--ro-bind", path, path]
        scratch = self.workdir / _SCRATCH
        scratch.mkdir(exist_ok=True)
        args += [
            "--bind",
            str(self.workdir.resolve()),
            _SANDBOX_DIR,
            "--bind",
            str(scratch.resolve()),
            "/tmp",
        ]
        args += ["--remount-ro", "/", "--chdir", _SANDBOX_DIR]
        return [*args, "--", *argv]


def _python_roots(python: str) -> tuple[str, ...]:
    """Host directories the interpreter needs (its prefix; a venv and its base), outside /usr."""
    roots = {sys.prefix, sys.base_prefix, str(Path(python).resolve().parent.parent)}
    return tuple(sorted(r for r in roots if not r.startswith("/usr") and Path(r).exists()))


def _limit_child(limits: SandboxLimits, cgroups: _Cgroups | None) -> None:
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


async def _read_capped(proc: asyncio.subprocess.Process, cap: int) -> tuple[bytes, bytes, bool]:
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
            if seen > 16 * cap:  # flooding: stop it rather than read forever
                cut = True
                _kill_group(proc.pid)
                break
        if seen > cap:
            kept += f"\n[... {seen - cap} more bytes cut]".encode()
        return bytes(kept)

    out, err = await asyncio.gather(drain(proc.stdout), drain(proc.stderr))
    await proc.wait()
    return out, err, cut


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill_tree(pid: int, cgroups: _Cgroups | None) -> None:
    """Kill bwrap's session (its PID namespace dies with it) and anything left in the cgroup."""
    _kill_group(pid)
    if cgroups is not None:
        cgroups.kill_all()


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _limit_hit(code: int, stderr: str, pids_limited: bool) -> str | None:
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
    if code in (-signal.SIGKILL, 137):
        return "memory"  # the cgroup's OOM killer is the one thing that SIGKILLs it here
    return None


class _Cgroups:
    """A pids (and memory) cgroup v1 for one run, where the host lets us make one."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @classmethod
    def make(cls, limits: SandboxLimits) -> _Cgroups | None:
        name = f"tapekit-sbx-{uuid.uuid4().hex[:12]}"
        made: dict[str, Path] = {}
        settings: dict[str, dict[str, str]] = {
            "pids": {"pids.max": str(limits.max_processes)},
            "memory": {
                "memory.limit_in_bytes": str(limits.memory_mb * 1024 * 1024 * 2),
                "memory.swappiness": "0",
            },
        }
        for controller, values in settings.items():
            base = _CGROUP_V1 / controller
            if not (base / "cgroup.procs").exists():
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
        return cls(made) if made else None

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
