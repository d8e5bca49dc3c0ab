"""The project's layout rules that a refactor could silently break.

- The library's tests never import the case studies in ``examples/`` (their own tests live in
  ``tests/examples/``): what a library test needs is in ``tests/`` or in :mod:`tapekit.testing`.
- ``import tapekit`` does not load :mod:`tapekit.testing` (its teams load only when named).
- README.md's layout table is the one the public modules' docstrings make.
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
    expected = ["examples.analyst", "examples.math_study", "examples.rag", "tapekit"]
    assert sorted(_imports_of(sample)) == expected


def test_importing_tapekit_loads_no_testing_team() -> None:
    code = "import sys, tapekit; print(sorted(m for m in sys.modules if m.startswith('tapekit.testing')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_readme_layout_table_is_what_the_docstrings_say() -> None:
    """README.md's layout table is generated (scripts/layout_table.py) from each public module's
    docstring, one row per public top-level module or package: a stale table fails here."""
    root = TESTS.parent
    result = subprocess.run(
        [sys.executable, str(root / "scripts" / "layout_table.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    readme = (root / "README.md").read_text()
    for entry in sorted((root / "tapekit").iterdir()):
        module = entry.suffix == ".py" or (entry / "__init__.py").exists()
        if module and not entry.name.startswith("_"):
            assert f"`tapekit/{entry.name}{'/' if entry.is_dir() else ''}`" in readme, entry.name
