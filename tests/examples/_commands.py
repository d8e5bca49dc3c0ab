"""Running an example as a newcomer's shell does: this interpreter (the venv's ``python``), from
the checkout's root, with no ``PYTHONPATH`` and no pytest or coverage variables."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """The environment a newcomer's shell has: no PYTHONPATH, no pytest or coverage variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "COV_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(command: str, *args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python COMMAND ARGS`` in a clean environment, from ``cwd`` (the root by default)."""
    return subprocess.run(
        [sys.executable, *shlex.split(command), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=clean_env(),
    )
