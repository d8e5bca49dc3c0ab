"""What the sandbox mounts and how bubblewrap is started: the command line (namespaces, a cleared
environment, the system read-only, the working directory read-write at ``/sandbox`` with its
``.tmp`` as ``/tmp``, the interpreter's installation read-only after that ``/tmp``), and the rules
for what may be mounted (a read-only bind must not cover the sandbox's own ``/tmp``, ``/proc``,
``/dev`` or ``/sandbox``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SANDBOX_DIR = "/sandbox"
SCRATCH = ".tmp"  # the workdir's subfolder mounted as /tmp
SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
# the sandbox's own mounts: a read-only bind that holds one of them would cover it
OWN_MOUNTS = ("/tmp", "/proc", "/dev", SANDBOX_DIR)
# host folders bound read-only as the system (an interpreter inside them needs nothing more)
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")


def bwrap_argv(workdir: Path, read_only: tuple[str, ...], argv: list[str]) -> list[str]:
    """bubblewrap's command line that runs ``argv`` in ``workdir`` with the host paths
    ``read_only`` (the interpreter's installation, the caller's ``bind_ro``) mounted read-only."""
    args = [
        "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PATH", SEARCH_PATH,
        "--setenv", "HOME", SANDBOX_DIR, "--setenv", "TMPDIR", "/tmp",
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
    scratch = workdir / SCRATCH
    scratch.mkdir(exist_ok=True)
    args += [
        "--bind",
        str(workdir.resolve()),
        SANDBOX_DIR,
        "--bind",
        str(scratch.resolve()),
        "/tmp",
    ]
    # after the scratch /tmp, or one under /tmp would be hidden by it (mounts apply in order)
    for path in read_only:
        clear_mount_point(scratch, path)
        args += ["--ro-bind", path, path]
    args += ["--remount-ro", "/", "--chdir", SANDBOX_DIR]
    return [*args, "--", *argv]


def python_roots(python: str) -> tuple[str, ...]:
    """Host folders the interpreter needs, outside the system folders bound anyway: its prefixes
    (a venv's and the base installation's) and the folders of the links on the way to its binary."""
    path = python if os.path.isabs(python) else shutil.which(python, path=SEARCH_PATH)
    if path is None:  # a name that only the sandbox's PATH resolves
        return ()
    path = os.path.abspath(path)
    roots = set(prefixes(path)) or {str(Path(path).resolve().parent.parent)}  # not a Python: its tree
    link = Path(path)
    for _ in range(40):  # a venv's python links into its base installation
        roots.add(str(link.parent))
        if not link.is_symlink():
            break
        link = link.parent / os.readlink(link)
    found = sorted(
        r
        for r in {os.path.normpath(os.path.abspath(r)) for r in roots}
        if Path(r).exists() and not any(within(r, system) for system in SYSTEM_DIRS)
    )
    return tuple(r for r in found if not any(r != other and within(r, other) for other in found))


@functools.cache
def prefixes(python: str) -> tuple[str, ...]:
    """``sys.prefix``, ``sys.base_prefix`` and the exec prefixes of the interpreter ``python``
    (asked, unless it is this one); () when it does not answer as a Python."""
    if python == os.path.abspath(sys.executable):
        return (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    ask = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"  # noqa: E501
    try:
        done = subprocess.run(
            [python, "-I", "-c", ask], capture_output=True, text=True, timeout=30, env={"PATH": SEARCH_PATH}
        )
        prefixes = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    if done.returncode != 0 or not isinstance(prefixes, list):
        return ()
    return tuple(p for p in prefixes if isinstance(p, str) and p)


def within(path: str, folder: str) -> bool:
    """True when ``path`` is ``folder`` or lies below it."""
    return Path(path).is_relative_to(folder)


def covers_own_mount(path: str) -> str | None:
    """The sandbox's own mount (``/tmp``, ``/proc``...) that a read-only bind of ``path`` would
    cover, or None."""
    return next((mount for mount in OWN_MOUNTS if within(mount, path)), None)


def clear_mount_point(scratch: Path, path: str) -> None:
    """A bind below ``/tmp`` is mounted in the scratch folder, where bubblewrap makes the folders on
    its way; remove what an earlier run left there in their place (a file, a link) so that it can."""
    if not within(path, "/tmp"):
        return
    here = scratch
    for part in Path(path).relative_to("/tmp").parts:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            here.unlink()
            return
        if not here.exists():
            return
