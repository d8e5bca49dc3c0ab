"""The project's layout rules that a refactor could silently break.

- The library's tests never import the case studies in ``examples/`` (their own tests live in
  ``tests/examples/``): what a library test needs is in ``tests/`` or in :mod:`tapekit.testing`.
- ``import tapekit`` does not load :mod:`tapekit.testing` (its teams load only when named).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imports_of(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # module specs in strings: "examples.x:attr" for the CLI, importlib.import_module(...)
            head = node.value.split(":")[0]
            if head.startswith("examples.") and head.replace(".", "").replace("_", "").isalnum():
                names.append(head)
    return names


def test_no_library_test_imports_the_examples() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if TESTS / "examples" in path.parents:
            continue
        bad = [n for n in _imports_of(path) if n == "examples" or n.startswith("examples.")]
        if bad and path.name != "test_layout.py":
            offenders.append(f"{path.relative_to(TESTS.parent)}: {sorted(set(bad))}")
    assert not offenders, "library tests that import examples/ (move them to tests/examples/):\n" + "\n".join(
        offenders
    )


def test_the_scanner_sees_each_way_of_naming_an_example(tmp_path: Path) -> None:
    sample = tmp_path / "t.py"
    sample.write_text(
        "import examples.rag\nfrom examples.math_study import agents\nrun('examples.analyst:team')\n"
        "from tapekit import Tape\nx = 'see examples/ for more'\n"
    )
    assert sorted(_imports_of(sample)) == ["examples.analyst", "examples.math_study", "examples.rag", "tapekit"]


def test_importing_tapekit_loads_no_testing_team() -> None:
    code = "import sys, tapekit; print(sorted(m for m in sys.modules if m.startswith('tapekit.testing')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
