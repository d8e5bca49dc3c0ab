"""The code sandbox: each escape a model's code might try is stopped with a clear observation, and
the host is untouched."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tapekit import Tape, UserStep
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
    project = Path(__file__).resolve().parents[1]
    result = sandbox.run_python(f"import os; print(os.path.exists({str(project)!r}), os.listdir('/'))")
    assert result.stdout.startswith("False"), result.stdout


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


def test_refuses_to_run_unconfined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with Sandbox() as box, pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        box.run_python("print(1)")


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)


def _process_count() -> int:
    out = subprocess.run(["ps", "-e", "--no-headers"], capture_output=True, text=True).stdout
    return len(out.splitlines())
