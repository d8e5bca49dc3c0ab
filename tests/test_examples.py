"""The README's snippet and the demo script work as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith("pip install -e . && python examples/analyst.py")
    test_command = 'pip install -e ".[dev]" && bash scripts/install-local.sh && pytest'
    assert block[1].startswith(test_command)
    assert (ROOT / ".ci" / "run").read_text().strip().endswith(test_command)


def test_readme_python_snippet_runs(capsys: object) -> None:
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec", dont_inherit=True), namespace)
    tape = namespace["tape"]
    assert tape.metadata.error is None, tape.metadata.error  # type: ignore[attr-defined]
    assert tape.steps[-1].text == "you said: hi"  # type: ignore[attr-defined]


def test_demo_script_prints_the_team_tape() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "analyst.py"), "Tell me about Acme Robotics in 3 sentences"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=60,
    ).stdout
    lines = out.splitlines()
    assert len(lines) == 19
    assert "analyst/search_agent.search" in out and "calls search_agent" in out
    assert lines[-1].split()[2:5] == ["analyst.act", "action", "assistant"]
    assert "Acme Robotics builds warehouse robots" in lines[-1]
