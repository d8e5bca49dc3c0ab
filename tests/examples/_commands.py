"""Running an example as a newcomer's shell does: this interpreter (the venv's ``python``), from
the checkout's root, with no ``PYTHONPATH`` and no pytest or coverage variables."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def missing_for_web(*packages: tuple[str, str]) -> list[str]:
    """What a web example needs and this machine lacks: Chromium at /usr/bin/chromium,
    playwright, miniwob, and ``packages`` given as (name to show, module to import)."""
    needed = [("playwright", "playwright"), ("miniwob", "miniwob"), *packages]
    missing = [] if os.path.exists("/usr/bin/chromium") else ["Chromium at /usr/bin/chromium"]
    return missing + [name for name, module in needed if importlib.util.find_spec(module) is None]


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


def load_module(path: Path, name: str) -> ModuleType:
    """The Python file ``path`` imported as the module ``name`` (its ``__main__`` block not run),
    registered in ``sys.modules`` as an import would be (dataclasses and pickling look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_script(stem: str) -> ModuleType:
    """``scripts/<stem>.py`` of the checkout as a module (the scripts are not a package)."""
    return load_module(ROOT / "scripts" / f"{stem}.py", stem)
