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

The parts, each in a private module: the :class:`Sandbox` and its runs (``_sandbox.py``), the
limits and results (``_limits.py``), bubblewrap's command line and mounts (``_mounts.py``), the
cgroups (``_cgroups.py``) and the process tree at run time: rlimits, capped output, the memory
watchdog (``_process.py``).
"""

from __future__ import annotations

from tapekit.sandbox._limits import SandboxLimits, SandboxResult
from tapekit.sandbox._sandbox import Sandbox, SandboxUnavailableError

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailableError"]
