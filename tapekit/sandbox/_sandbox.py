"""The :class:`Sandbox`: one working directory, and runs of code confined in it (see the
package docstring for what confines them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tapekit.effects import Effect
from tapekit.environment import Tool
from tapekit.errors import TapekitError
from tapekit.sandbox._cgroups import Cgroups
from tapekit.sandbox._limits import SandboxLimits, SandboxResult, limit_hit
from tapekit.sandbox._mounts import (
    SANDBOX_DIR,
    SCRATCH,
    SEARCH_PATH,
    bwrap_argv,
    covers_own_mount,
    python_roots,
)
from tapekit.sandbox._process import kill_tree, limit_child, read_capped, watch_memory


class SandboxUnavailableError(TapekitError, RuntimeError):
    """The host cannot confine code (no ``bwrap``, or namespaces are not permitted)."""


class Sandbox:
    """Runs code confined (see :mod:`tapekit.sandbox`). One sandbox keeps one working directory across
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
            covered = covers_own_mount(path)
            if covered:
                raise ValueError(f"bind_ro: {path} would cover the sandbox's own {covered}")
        self._python_roots = python_roots(self.python)
        for root in self._python_roots:
            covered = covers_own_mount(root)
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
            return await self.arun([self.python, "-I", "-B", f"{SANDBOX_DIR}/{name}"])
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
        cgroups = Cgroups.make(self.limits)
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                bwrap,
                *args[1:],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={"PATH": SEARCH_PATH},  # bwrap's own environment is readable inside (/proc/1/environ)
                close_fds=True,
                preexec_fn=lambda: limit_child(self.limits, cgroups),
                start_new_session=True,
            )
        except BaseException:
            if cgroups:
                cgroups.remove()
            raise
        stopped_by = None
        out, err = b"", b""
        reader = asyncio.ensure_future(read_capped(proc, self.limits.max_output_bytes))
        watcher = asyncio.ensure_future(watch_memory(proc.pid, cgroups, self.limits.memory_mb * 1024 * 1024))
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
            kill_tree(proc.pid, cgroups)
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
        stopped_by = stopped_by or limit_hit(code, stderr, peak_pids_hit)
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
            if p.is_file() and not p.name.startswith(".tapekit-") and p.parts[len(root.parts)] != SCRATCH
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
        return bwrap_argv(self.workdir, self._python_roots + self.bind_ro, argv)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
