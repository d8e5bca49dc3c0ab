"""Every example command the docs show runs as the docs spell it, in a clean subprocess.

A newcomer types ``python examples/analyst.py`` from the checkout's root. That puts
``examples/`` first on ``sys.path``, so a package there named like a module of the standard
library or of an installed distribution shadows it (``examples/math/`` once broke every script:
on some CPython builds ``math`` is a shared library found through ``sys.path``). These tests run
each documented command without the test process's ``sys.path`` or ``PYTHONPATH``, so a shadowed
module or a missing install step fails the suite instead of a newcomer's first try.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

from tests.examples._commands import ROOT, run

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# `python examples/x.py ...` or `python -m examples.x.y ...`, as written in a shell line
COMMAND = re.compile(r"python (-m examples\.[\w.]+|examples/[\w/]+\.py)")


def documented_commands() -> dict[str, str]:
    """Each example entry point the docs name, mapped to the first doc that names it."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for match in COMMAND.finditer(doc.read_text()):
            found.setdefault(match.group(1), doc.name)
    return found


def test_the_docs_name_the_main_examples() -> None:
    commands = documented_commands()
    for script in ("examples/analyst.py", "examples/research.py", "examples/math_distill.py"):
        assert script in commands, f"no doc shows `python {script}`"
    for command in commands:
        if command.startswith("examples/"):
            assert (ROOT / command).is_file(), f"{commands[command]} names {command}, which does not exist"


@pytest.mark.parametrize("command", sorted(documented_commands()))
def test_each_documented_example_command_answers_help(command: str) -> None:
    result = run(command, "--help", timeout=180)
    assert result.returncode == 0, f"python {command} --help failed:\n{result.stderr[-3000:]}"
    assert "usage:" in result.stdout.lower(), result.stdout[-2000:]


def test_no_example_module_shadows_an_installed_or_standard_module() -> None:
    """``python examples/x.py`` puts ``examples/`` first on ``sys.path``: nothing in it may be
    named like a module of the standard library or of an installed distribution."""
    taken = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    taken |= set(importlib.metadata.packages_distributions())  # installed top-level names
    assert "math" in taken and "pydantic" in taken  # the check itself can see what it guards
    shadows = []
    for entry in (ROOT / "examples").iterdir():
        name = entry.stem if entry.suffix == ".py" else entry.name
        if entry.name.startswith((".", "__")) or not (entry.suffix == ".py" or entry.is_dir()):
            continue
        if name in taken:
            shadows.append(entry.name)
    assert not shadows, f"examples/ shadows these modules when a script runs: {shadows}"


def test_the_scripted_demo_runs_end_to_end_from_a_fresh_folder(tmp_path: Path) -> None:
    result = run(str(ROOT / "examples" / "analyst.py"), "--model", "scripted", "--db", "d.db", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stored as tape" in result.stdout and "(8 LLM calls, model scripted-brain)" in result.stdout
    assert (tmp_path / "d.db").is_file()


def test_research_example_runs_as_a_script() -> None:
    result = run("examples/research.py", "--latency", "0.05", timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2].split()[2:5] == ["lead.fan_out", "control", "fork"]
    assert sum("lead/searcher.summarize" in line for line in lines) == 3
    assert "16 steps, 8 LLM calls of 0.05 s each" in result.stdout
