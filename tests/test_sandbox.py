"""The code sandbox: each escape a model's code might try is stopped with a clear observation, and
the host is untouched."""

from __future__ import annotations

import ast
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit import Agent, FunctionLLM, LLMOutput, Prompt, Tape, ToolCallRequest, ToolEnvironment, UserStep
from tapekit.effects import Effect
from tapekit.sandbox import Sandbox, SandboxLimits, SandboxUnavailableError

pytestmark = pytest.mark.skipif(
    Sandbox.available() is not None, reason=f"sandbox unavailable: {Sandbox.available()}"
)


@pytest.fixture
def sandbox() -> Sandbox:
    with Sandbox(SandboxLimits(wall_s=20, cpu_s=5, memory_mb=256, max_processes=16)) as box:
        yield box


def test_runs_code_and_keeps_files_in_its_workdir(sandbox: Sandbox) -> None:
    result = sandbox.run_python("open('out.txt', 'w').write('42')\nprint(6 * 7)")
    assert result.ok, result
    assert result.stdout.strip() == "42"
    assert result.files == ["out.txt"]
    assert (sandbox.workdir / "out.txt").read_text() == "42"
    again = sandbox.run_python("print(open('out.txt').read())")  # same workdir across runs
    assert again.stdout.strip() == "42"


def test_a_failing_program_reports_its_traceback(sandbox: Sandbox) -> None:
    result = sandbox.run_python("raise ValueError('boom')")
    assert result.exit_code == 1 and result.stopped_by is None
    assert "ValueError: boom" in result.stderr
    assert "exit code: 1" in result.to_observation()


def test_no_network() -> None:
    # a real server on the host's loopback: reachable from here, not from the sandbox
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    code = (
        "import socket\n"
        "for host in ['127.0.0.1', '1.1.1.1']:\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2); print('CONNECTED', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', host, type(e).__name__)\n"
    )
    with Sandbox(SandboxLimits(wall_s=20)) as box:
        result = box.run_python(code)
    server.close()
    assert "CONNECTED" not in result.stdout
    assert result.stdout.count("blocked") == 2
    assert accepted == []


def test_cannot_write_outside_its_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    home = Path.home() / f"tapekit-sandbox-probe-{os.getpid()}"
    code = (
        "import os\n"
        f"for path in [{str(victim)!r}, {str(home)!r}, '/usr/evil', '/etc/evil', {sys.prefix!r} + '/evil']:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('WROTE', path)\n"
        "    except OSError as e:\n"
        "        print('refused', path, e.errno)\n"
    )
    result = sandbox.run_python(code)
    assert "WROTE" not in result.stdout, result.stdout
    assert result.stdout.count("refused") == 5
    assert victim.read_text() == "untouched"
    assert not home.exists()
    assert not Path("/usr/evil").exists() and not Path(sys.prefix, "evil").exists()


def test_host_files_are_not_visible(sandbox: Sandbox) -> None:
    # the project's files, not its folder: a venv inside it (.venv) is mounted, and its folders with it
    project = Path(__file__).resolve().parents[1]
    probes = [str(Path(__file__).resolve()), str(project / "pyproject.toml"), str(project / "tapekit")]
    result = sandbox.run_python(f"import os; print([os.path.exists(p) for p in {probes!r}], os.listdir('/'))")
    assert result.stdout.startswith("[False, False, False]"), result.stdout


def test_fork_bomb_is_stopped(sandbox: Sandbox) -> None:
    before = _process_count()
    code = "import os\nwhile True:\n    os.fork()\n"
    result = sandbox.run_python(code)
    assert result.stopped_by in ("processes", "wall time"), result
    assert "stopped:" in result.to_observation()
    assert _process_count() <= before + 5  # nothing left behind


def test_memory_exhaustion_is_stopped(sandbox: Sandbox) -> None:
    result = sandbox.run_python("blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 1024 * 1024))\n")
    assert result.stopped_by == "memory", result
    assert "memory limit" in result.to_observation()


def test_cpu_and_wall_time_are_bounded() -> None:
    with Sandbox(SandboxLimits(cpu_s=1, wall_s=30)) as box:
        spin = box.run_python("while True:\n    pass\n")
    assert spin.stopped_by == "cpu time", spin
    with Sandbox(SandboxLimits(cpu_s=30, wall_s=1)) as box:
        sleep = box.run_python("import time\ntime.sleep(60)\n")
    assert sleep.stopped_by == "wall time", sleep
    assert sleep.duration_s < 30


def test_output_flood_is_cut(sandbox: Sandbox) -> None:
    result = sandbox.run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert result.stopped_by == "output"
    assert len(result.stdout) < 2 * sandbox.limits.max_output_bytes


def test_as_a_tool_in_a_tool_environment() -> None:
    from tapekit import ToolEnvironment
    from tapekit.dialog import ToolCall, ToolResult

    with Sandbox() as box:
        env = ToolEnvironment([box.python_tool()])
        call = ToolCall(name="run_python", arguments={"code": "print(2 ** 10)"}, call_id="c1")
        tape = Tape(steps=[UserStep(content="compute"), call])
        result = asyncio.run(env.areact(tape))
    observation = result.steps[-1]
    assert isinstance(observation, ToolResult)
    assert "1024" in str(observation.content)
    with Sandbox() as box:  # a resumed session re-runs code by default; once for a workdir that outlives it
        assert box.python_tool().effect == "read" and box.python_tool(effect="once").effect == "once"


def test_refuses_to_run_unconfined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with Sandbox() as box, pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        box.run_python("print(1)")


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)


@pytest.fixture
def venv_under_tmp() -> Iterator[Path]:
    """A venv below /tmp (as ``mktemp -d`` or a CI checkout makes), whatever TMPDIR says; its
    python links into the base installation."""
    top = Path(tempfile.mkdtemp(prefix="tapekit-test-venv-", dir="/tmp"))
    venv = top / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", "--symlinks", str(venv)],
        check=True,
        capture_output=True,
    )
    yield venv
    shutil.rmtree(top, ignore_errors=True)


def test_an_interpreter_under_tmp_stays_visible(venv_under_tmp: Path) -> None:
    python = venv_under_tmp / "bin" / "python"
    assert python.is_symlink()  # the base installation it points to must be visible too
    with Sandbox(SandboxLimits(wall_s=20), python=str(python)) as box:
        result = box.run_python("import sys; print(sys.prefix); print(sys.base_prefix != sys.prefix)")
        assert result.ok, result
        assert result.stdout.split() == [str(venv_under_tmp), "True"]
        # the venv's mount point lies in the sandbox's own /tmp: a file (or link) put in its way by
        # one run must not stop the next
        top = str(venv_under_tmp.parent)
        sabotage = box.run_python(
            f"import os\nos.rename({top!r}, '/tmp/moved')\nopen({top!r}, 'w').write('in the way')\n"
        )
        assert sabotage.ok, sabotage
        again = box.run_python("import sys; print(sys.prefix)")
        assert again.ok, again
        assert again.stdout.strip() == str(venv_under_tmp)


def test_binds_that_would_cover_the_sandbox_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="would cover the sandbox's own /tmp"):
        Sandbox(bind_ro=("/tmp",))
    with pytest.raises(ValueError, match="would cover the sandbox's own /tmp"):
        Sandbox(bind_ro=("/",))
    # an "interpreter" whose installation is the whole host
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'["/", "/", "/", "/"]\'\n')
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailableError, match="installation / would cover the sandbox's own /tmp"):
        Sandbox(python=str(fake))


def test_the_host_environment_does_not_cross(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"sk-tapekit-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("TAPEKIT_TEST_SECRET", secret)
    code = (
        "import glob, os\n"
        "paths = sorted(glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'))\n"
        "for path in paths + ['/proc/self/environ', '/proc/self/cmdline']:\n"
        "    try:\n"
        "        print('READ', path, open(path, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print('unreadable', path, e)\n"
        "print('ENV', dict(os.environ))\n"
    )
    with Sandbox(SandboxLimits(wall_s=20)) as box:
        result = box.run_python(code)
    assert result.ok, result
    # bubblewrap's own environment and command line (pid 1) were read, and hold no secret
    assert "READ /proc/1/environ" in result.stdout and "READ /proc/1/cmdline" in result.stdout
    assert secret not in result.stdout
    assert "OPENAI_API_KEY" not in result.stdout and "TAPEKIT_TEST_SECRET" not in result.stdout


def test_no_file_descriptor_is_inherited(tmp_path: Path) -> None:
    secret = f"sk-tapekit-{uuid.uuid4().hex}"
    path = tmp_path / "secret.txt"
    path.write_text(secret)
    fd = os.open(path, os.O_RDONLY)
    os.set_inheritable(fd, True)
    code = (
        "import os\n"
        "fds = sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
        "print('FDS', fds)\n"
        "for fd in fds:\n"
        "    try:\n"
        "        print(fd, os.readlink(f'/proc/self/fd/{fd}'), os.pread(fd, 200, 0))\n"
        "    except OSError as e:\n"
        "        print(fd, 'unreadable', e)\n"
    )
    try:
        with Sandbox(SandboxLimits(wall_s=20)) as box:
            result = box.run_python(code)
    finally:
        os.close(fd)
    assert result.ok, result
    fds = ast.literal_eval(result.stdout.splitlines()[0].removeprefix("FDS "))
    assert set(fds) <= {0, 1, 2, 3}, result.stdout  # stdio and the one listing /proc/self/fd
    assert secret not in result.stdout and str(path) not in result.stdout


_THREE_CHILDREN = """
import os, time
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (150 << 20)  # written, so resident
        time.sleep(3)
        os._exit(0)
    pids.append(pid)
codes = [os.waitpid(pid, 0)[1] for pid in pids]
print("ALL ALIVE" if codes == [0, 0, 0] else f"exits {codes}")
"""


@pytest.fixture(params=["default", "watchdog"])
def memory_mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The host's way of bounding the tree's memory (a cgroup where one can be made), and the
    watchdog that bounds it without a cgroup."""
    if request.param == "watchdog":
        monkeypatch.setattr("tapekit.sandbox._cgroups.Cgroups.make", lambda limits: None)
    return str(request.param)


def test_memory_limit_covers_the_process_tree(memory_mechanism: str) -> None:
    # each child is under memory_mb, the three together are not
    with Sandbox(SandboxLimits(wall_s=30, memory_mb=300)) as box:
        result = box.run_python(_THREE_CHILDREN)
    assert "ALL ALIVE" not in result.stdout, result
    assert result.stopped_by == "memory", result
    assert not result.ok and "stopped: the memory limit was exceeded" in result.to_observation()
    assert result.duration_s < 20


def test_memory_limit_leaves_a_process_under_it_alone(memory_mechanism: str) -> None:
    with Sandbox(SandboxLimits(wall_s=30, memory_mb=300)) as box:
        result = box.run_python("import time\nblock = b'x' * (100 << 20)\ntime.sleep(1)\nprint('alive')\n")
    assert result.ok, result
    assert result.stdout.strip() == "alive"


def _process_count() -> int:
    out = subprocess.run(["ps", "-e", "--no-headers"], capture_output=True, text=True).stdout
    return len(out.splitlines())


# --- a session killed while its sandboxed code runs (docs/durability.md, "Sandboxes") ---------

_KILLED_CODE = (
    "runs = open('ledger.txt', 'a+')\n"
    "runs.write('ran\\n'); runs.flush(); runs.seek(0)\n"
    "if len(runs.read().split()) == 1:\n"
    "    import time\n"
    "    time.sleep(120)\n"
    "print('finished')\n"
)


def _coder(workdir: Path, effect: Effect) -> tuple[Agent, ToolEnvironment, Sandbox]:
    """The agent (one run_python call, then "done"), its environment and the sandbox on
    ``workdir``: what both the killed process and the resuming one build."""
    from tapekit.testing.react import ReactNode

    def model(prompt: Prompt) -> LLMOutput:
        if prompt.messages[-1]["role"] == "tool":
            return LLMOutput(content="done")
        return LLMOutput(tool_calls=[ToolCallRequest(id="c1", name="run_python", arguments=_json_code())])

    box = Sandbox(SandboxLimits(wall_s=300, cpu_s=30), workdir=workdir)
    env = ToolEnvironment([box.python_tool(effect=effect)])
    agent = Agent.create(
        name="coder", llms=FunctionLLM(fn=model), nodes=[ReactNode(tools=env.tool_schemas())]
    )
    return agent, env, box


def _json_code() -> str:
    import json

    return json.dumps({"code": _KILLED_CODE})


def _killed_child(db: str, workdir: str, effect: Effect) -> None:
    """Run in a child process: start the session; it is killed inside the sandboxed code."""
    from tapekit import main_loop
    from tapekit.store import SQLiteStore

    agent, env, _ = _coder(Path(workdir), effect)
    start: Tape[Any, Any] = Tape(steps=[UserStep(content="append to the ledger")])
    print(start.metadata.id, flush=True)
    with SQLiteStore(db) as store:
        main_loop(agent, start, env, store=store).get_final_tape()


def _start_and_kill(tmp_path: Path, effect: Effect) -> tuple[Path, Path, str]:
    import signal
    import time

    db, workdir = tmp_path / "s.db", tmp_path / "work"
    workdir.mkdir()
    root = Path(__file__).resolve().parents[1]
    args = f"{str(db)!r}, {str(workdir)!r}, {effect!r}"
    child = subprocess.Popen(
        [sys.executable, "-c", f"import tests.test_sandbox as t; t._killed_child({args})"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    tape_id = child.stdout.readline().strip()
    ledger = workdir / "ledger.txt"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (ledger.exists() and ledger.read_text()):
        time.sleep(0.05)
    assert ledger.read_text() == "ran\n", "the sandboxed code never ran"
    # A "read" call is not logged ahead of running (only "once" is), so the store's writer may
    # not have flushed the tool call yet on a loaded machine: kill only once it is stored.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _stored_steps(db, tape_id) < 2:
        time.sleep(0.05)
    assert _stored_steps(db, tape_id) >= 2, "the tool call never reached the store"
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10  # bwrap --die-with-parent: the code dies with the session
    while time.monotonic() < deadline and _running_in(workdir):
        time.sleep(0.1)
    assert not _running_in(workdir), "the killed session's sandboxed code is still running"
    return db, workdir, tape_id


def _stored_steps(db: Path, tape_id: str) -> int:
    """How many steps of ``tape_id`` another process's store has committed to ``db`` (0: none)."""
    from tapekit.store import SQLiteStore, TapeNotFoundError

    with SQLiteStore(db) as store:
        try:
            return len(store.get_tape(tape_id).steps)
        except TapeNotFoundError:
            return 0


def _running_in(workdir: Path) -> bool:
    found = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True)
    return bool(found.stdout.split())


def test_a_once_sandbox_killed_mid_run_is_not_run_again_on_resume(tmp_path: Path) -> None:
    """``python_tool(effect="once")`` on a working directory that outlives the process: the
    session is SIGKILLed while the code runs; the code dies with it, and the resume does not run
    it again but waits in doubt; resolved done, the session ends, the code having run once."""
    from tapekit import InDoubtToolCall, main_loop
    from tapekit.dialog import ToolResult
    from tapekit.store import SQLiteStore

    db, workdir, tape_id = _start_and_kill(tmp_path, "once")
    agent, env, box = _coder(workdir, "once")
    with SQLiteStore(db) as store, box:
        events = list(main_loop(agent, store.get_tape(tape_id), env, store=store))
        waiting = [e.external for e in events if e.external is not None]
        assert len(waiting) == 1 and isinstance(waiting[0], InDoubtToolCall), events
        assert (workdir / "ledger.txt").read_text() == "ran\n"
        [effect] = store.tool_effects(in_doubt=True)
        store.resolve_tool_effect(effect.key, result="ran once (read the ledger)")
        final = main_loop(agent, store.get_tape(tape_id), env, store=store).get_final_tape()
    results = [s for s in final.steps if isinstance(s, ToolResult)]
    assert [r.content for r in results] == ["ran once (read the ledger)"]
    assert (workdir / "ledger.txt").read_text() == "ran\n"


def test_a_read_sandbox_killed_mid_run_runs_again_on_resume(tmp_path: Path) -> None:
    """The default, ``"read"``: the same kill, and the resume runs the code again (the ledger
    gets a second line): right for a throwaway working directory, wrong for this one."""
    from tapekit import main_loop
    from tapekit.dialog import ToolResult
    from tapekit.store import SQLiteStore

    db, workdir, tape_id = _start_and_kill(tmp_path, "read")
    agent, env, box = _coder(workdir, "read")
    with SQLiteStore(db) as store, box:
        final = main_loop(agent, store.get_tape(tape_id), env, store=store).get_final_tape()
    [result] = [s for s in final.steps if isinstance(s, ToolResult)]
    assert "finished" in str(result.content)
    assert (workdir / "ledger.txt").read_text() == "ran\nran\n"
