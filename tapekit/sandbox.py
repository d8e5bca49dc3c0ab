"""A sandbox for code the agent writes: no network, bounded CPU, memory, processes and time, and
one temporary working directory as the only writable place.

The isolation is Debian's bubblewrap (``bwrap``): new user, network, PID, IPC and UTS namespaces;
the system and the Python installation mounted read-only; the working directory mounted
read-write at ``/sandbox`` (its ``.tmp`` subfolder is the sandbox's ``/tmp``); everything else,
the sandbox's own root included, read-only. The interpreter's installation (its prefix and, for a
venv, the base installation it links to) is mounted after that ``/tmp``, so an interpreter that
lives under ``/tmp`` (a venv made with ``mktemp -d``, a CI checkout) stays visible; one installed in
a folder that holds ``/tmp``, ``/proc``, ``/dev`` or ``/sandbox`` (``/`` itself) is refused
(:class:`SandboxUnavailableError`).

Nothing of the caller's environment crosses: bubblewrap itself is started with a minimal
environment (its own ``/proc/1/environ`` is visible inside), the code gets only the variables the
sandbox sets, and no file descriptor but stdin (``/dev/null``), stdout and stderr is inherited.

Inside it, resource limits (``setrlimit``) bound address space, CPU seconds, file size and open
files of each process. ``memory_mb`` also bounds the whole process tree: with a cgroup v1
``memory`` controller (made in the caller's own cgroup, where the host lets us) its limit is
``memory_mb``, the kernel kills a process when the tree goes over it, and the run is stopped;
where no such cgroup can be made (a host with cgroup v2 only, no permission), a watchdog sums the
proportional set size (``Pss``, else RSS) of the sandbox's processes every 0.1 s and kills the
tree when the sum is over ``memory_mb`` (a spike shorter than that can pass). Either way the result
says ``stopped_by="memory"``. A ``pids`` cgroup, where one can be made, bounds the number of
processes, which ``RLIMIT_NPROC`` cannot do for root. A wall-clock timeout kills the whole tree.
``scripts/install-system.sh`` installs bubblewrap; without it :class:`Sandbox` refuses to run
(:class:`SandboxUnavailableError`) instead of running code unconfined.

Typical use, as a tool of a :class:`~tapekit.environment.ToolEnvironment`::

    sandbox = Sandbox(SandboxLimits(wall_s=10, memory_mb=512))
    env = ToolEnvironment([sandbox.python_tool()])
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tapekit.effects import Effect
from tapekit.environment import Tool
from tapekit.errors import TapekitError

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailableError"]

_CGROUP_V1 = Path("/sys/fs/cgroup")
_SANDBOX_DIR = "/sandbox"
_SCRATCH = ".tmp"  # the workdir's subfolder mounted as /tmp
_PATH = "/usr/local/bin:/usr/bin:/bin"
# the sandbox's own mounts: a read-only bind that holds one of them would cover it
_OWN_MOUNTS = ("/tmp", "/proc", "/dev", _SANDBOX_DIR)
# host folders bound read-only as the system (an interpreter inside them needs nothing more)
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
_CGROUP_POLL_S = 0.05  # how often the run's memory cgroup is asked whether it killed something
_WATCHDOG_POLL_S = 0.1  # how often the watchdog sums the tree's memory (no memory cgroup)
_PAGE = os.sysconf("SC_PAGE_SIZE")


class SandboxUnavailableError(TapekitError, RuntimeError):
    """The host cannot confine code (no ``bwrap``, or namespaces are not permitted)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. ``wall_s`` is real time; ``cpu_s`` CPU seconds of the main process;
    ``memory_mb`` the memory of the whole process tree (a cgroup, else a watchdog: see the module
    docs) and the address space of each process;
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


class Sandbox:
    """Runs code confined (see the module docs). One sandbox keeps one working directory across
    runs (so code can write a file in one run and read it in the next) until :meth:`close`.

    ``workdir``: use this directory instead of a fresh temporary one (it is not deleted).
    ``python``: the interpreter to run (default: this one), with its installation (prefix, a venv's
    base, installed packages) visible read-only at the same paths wherever it lives, ``/tmp``
    included; :class:`SandboxUnavailableError` if its installation holds ``/tmp``, ``/proc``,
    ``/dev`` or ``/sandbox``. ``bind_ro``: extra host paths to mount read-only at the same place
    (``ValueError`` for one that would cover one of those).
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
        self.bind_ro = tuple(os.path.abspath(path) for path in bind_ro)
        for path in self.bind_ro:
            covered = _covers_own_mount(path)
            if covered:
                raise ValueError(f"bind_ro: {path} would cover the sandbox's own {covered}")
        self._python_roots = _python_roots(self.python)
        for root in self._python_roots:
            covered = _covers_own_mount(root)
            if covered:
                raise SandboxUnavailableError(
                    f"cannot confine the interpreter {self.python}: its installation {root} would cover "
                    f"the sandbox's own {covered}; use an interpreter (or a venv) installed elsewhere"
                )
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
        bwrap = shutil.which("bwrap")
        if reason or bwrap is None:
            raise SandboxUnavailableError(f"cannot run code confined: {reason}")
        args = self._bwrap_argv(argv)
        cgroups = _Cgroups.make(self.limits)
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                bwrap,
                *args[1:],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={"PATH": _PATH},  # bwrap's own environment is readable inside (/proc/1/environ)
                close_fds=True,
                preexec_fn=lambda: _limit_child(self.limits, cgroups),
                start_new_session=True,
            )
        except BaseException:
            if cgroups:
                cgroups.remove()
            raise
        stopped_by = None
        out, err = b"", b""
        reader = asyncio.ensure_future(_read_capped(proc, self.limits.max_output_bytes))
        watcher = asyncio.ensure_future(_watch_memory(proc.pid, cgroups, self.limits.memory_mb * 1024 * 1024))
        try:
            done, _ = await asyncio.wait(
                {reader, watcher}, timeout=self.limits.wall_s, return_when=asyncio.FIRST_COMPLETED
            )
            if watcher in done:  # it killed the tree: keep what the code printed before
                stopped_by = "memory"
                done, _ = await asyncio.wait({reader}, timeout=5)
            if reader in done:
                out, err, cut = reader.result()
                if cut and stopped_by is None:
                    stopped_by = "output"
            elif stopped_by is None:
                stopped_by = "wall time"
        finally:
            for task in (reader, watcher):
                task.cancel()
            await asyncio.gather(reader, watcher, return_exceptions=True)
            _kill_tree(proc.pid, cgroups)
            with contextlib.suppress(Exception):  # drain and close the pipes of a killed run
                await asyncio.wait_for(proc.communicate(), timeout=5)
            code = await proc.wait()
            peak_pids_hit = cgroups.pids_limited() if cgroups else False
            oom_killed = cgroups.oom_kills() > 0 if cgroups else False
            if cgroups:
                cgroups.remove()
        stdout, stderr = _text(out), _text(err)
        if stopped_by is None and oom_killed:
            stopped_by = "memory"
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

    def python_tool(self, name: str = "run_python", *, effect: Effect = "read") -> Tool:
        """A :class:`~tapekit.environment.Tool` that runs Python code here and answers with the
        run as text (limits hit, exit code, output, files).

        ``effect`` (:mod:`tapekit.effects`): the default ``"read"`` suits a sandbox whose working
        directory lives and dies with the process (a resumed session in a new process gets a new
        one, so running the code again there is the only way to have its files). Give
        ``"once"`` for a sandbox on a working directory of yours that outlives the process, where
        code run twice would append to its files twice."""
        sandbox = self

        async def run_python(code: str) -> str:
            """Run Python code in a sandbox without network; print what you want to see.

            Args:
                code: a complete Python program; files it writes stay in its working directory.
            """
            return (await sandbox.arun_python(code)).to_observation()

        return Tool(run_python, name=name, effect=effect)

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
            "--clearenv", "--setenv", "PATH", _PATH,
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
        # after the scratch /tmp, or one under /tmp would be hidden by it (mounts apply in order)
        for path in self._python_roots + self.bind_ro:
            _clear_mount_point(scratch, path)
            args += ["--ro-bind", path, path]
        args += ["--remount-ro", "/", "--chdir", _SANDBOX_DIR]
        return [*args, "--", *argv]


def _python_roots(python: str) -> tuple[str, ...]:
    """Host folders the interpreter needs, outside the system folders bound anyway: its prefixes
    (a venv's and the base installation's) and the folders of the links on the way to its binary."""
    path = python if os.path.isabs(python) else shutil.which(python, path=_PATH)
    if path is None:  # a name that only the sandbox's PATH resolves
        return ()
    path = os.path.abspath(path)
    roots = set(_prefixes(path)) or {str(Path(path).resolve().parent.parent)}  # not a Python: its tree
    link = Path(path)
    for _ in range(40):  # a venv's python links into its base installation
        roots.add(str(link.parent))
        if not link.is_symlink():
            break
        link = link.parent / os.readlink(link)
    found = sorted(
        r
        for r in {os.path.normpath(os.path.abspath(r)) for r in roots}
        if Path(r).exists() and not any(_within(r, system) for system in _SYSTEM_DIRS)
    )
    return tuple(r for r in found if not any(r != other and _within(r, other) for other in found))


@functools.cache
def _prefixes(python: str) -> tuple[str, ...]:
    """``sys.prefix``, ``sys.base_prefix`` and the exec prefixes of the interpreter ``python``
    (asked, unless it is this one); () when it does not answer as a Python."""
    if python == os.path.abspath(sys.executable):
        return (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    ask = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"  # noqa: E501
    try:
        done = subprocess.run(
            [python, "-I", "-c", ask], capture_output=True, text=True, timeout=30, env={"PATH": _PATH}
        )
        prefixes = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    if done.returncode != 0 or not isinstance(prefixes, list):
        return ()
    return tuple(p for p in prefixes if isinstance(p, str) and p)


def _within(path: str, folder: str) -> bool:
    """True when ``path`` is ``folder`` or lies below it."""
    return Path(path).is_relative_to(folder)


def _covers_own_mount(path: str) -> str | None:
    """The sandbox's own mount (``/tmp``, ``/proc``...) that a read-only bind of ``path`` would
    cover, or None."""
    return next((mount for mount in _OWN_MOUNTS if _within(mount, path)), None)


def _clear_mount_point(scratch: Path, path: str) -> None:
    """A bind below ``/tmp`` is mounted in the scratch folder, where bubblewrap makes the folders on
    its way; remove what an earlier run left there in their place (a file, a link) so that it can."""
    if not _within(path, "/tmp"):
        return
    here = scratch
    for part in Path(path).relative_to("/tmp").parts:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            here.unlink()
            return
        if not here.exists():
            return


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
            if seen > 16 * cap and not cut:  # flooding: stop it rather than read forever
                cut = True
                _kill_group(proc.pid)
            # and read on to the end: a pipe left unread is never closed, and asyncio reports the
            # exit (proc.wait()) only once both pipes are
        if seen > cap:
            kept += f"\n[... {seen - cap} more bytes cut]".encode()
        return bytes(kept)

    out, err = await asyncio.gather(drain(proc.stdout), drain(proc.stderr))
    await proc.wait()
    return out, err, cut


async def _watch_memory(pid: int, cgroups: _Cgroups | None, limit: int) -> None:
    """Return, having killed the run, once its process tree is over ``limit`` bytes: the memory
    cgroup killed a process (it holds the tree to the limit), or, without one, the tree's summed
    memory is over it. Runs until cancelled otherwise."""
    if cgroups is not None and cgroups.bounds_memory:
        while cgroups.oom_kills() == 0:
            await asyncio.sleep(_CGROUP_POLL_S)
    else:
        while _tree_memory(pid) <= limit:
            await asyncio.sleep(_WATCHDOG_POLL_S)
    _kill_tree(pid, cgroups)


def _tree_memory(root: int) -> int:
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
        total += _process_memory(pid)
        todo.extend(children.get(pid, ()))
    return total


def _process_memory(pid: int) -> int:
    """The proportional set size of a process (shared pages split among their sharers, so a tree
    of forks is not counted several times), else its resident set size, in bytes; 0 if gone."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE
    return 0


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
    return None  # the tree's memory limit is told by its cgroup or its watchdog, not guessed here


class _Cgroups:
    """A pids and a memory cgroup v1 for one run, where the host lets us make them: in the caller's
    own cgroup of each controller when it can be found, else at the top of the hierarchy."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @classmethod
    def make(cls, limits: SandboxLimits) -> _Cgroups | None:
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
            base = _own_cgroup(controller)
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


def _own_cgroup(controller: str) -> Path | None:
    """The folder of this process's cgroup v1 for ``controller`` (where the sandbox's is made, so
    that the limits above ours still hold), the hierarchy's top if that is not visible, or None
    when the controller is not mounted as cgroup v1."""
    mount = _CGROUP_V1 / controller
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
