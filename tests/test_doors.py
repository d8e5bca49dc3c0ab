"""The doors (``tapekit._doors.DOORS``): the root and the package faces are tapekit's API. The
examples and the guides import only from them, only they declare ``__all__``, and every name a
door declares is there (lazy names checked without importing their heavy modules)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tapekit._doors import DOORS, FACES

ROOT = Path(__file__).resolve().parent.parent
PYTHON_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)  # "```python train" too


def tapekit_imports(source: str, first_line: int = 1) -> Iterator[tuple[int, str]]:
    """(line, module) for each import of a tapekit module in ``source``, nested ones included."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            if module == "tapekit" or module.startswith("tapekit."):
                yield first_line + node.lineno - 1, module


def python_sources() -> Iterator[tuple[Path, int, str]]:
    """(file, first line, code): the examples' and docs' Python files, and the Python blocks of
    README.md and every guide (docs/**/*.md)."""
    for path in sorted([*(ROOT / "examples").rglob("*.py"), *(ROOT / "docs").rglob("*.py")]):
        yield path, 1, path.read_text()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        for block in PYTHON_BLOCK.finditer(text):
            yield path, text.count("\n", 0, block.start(1)) + 1, block.group(1)


def back_doors(sources: Iterator[tuple[Path, int, str]]) -> list[str]:
    """``file:line: module`` for each tapekit import that names no door."""
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {module}"
        for path, first, code in sources
        for line, module in tapekit_imports(code, first)
        if module not in DOORS
    ]


def test_examples_and_guides_import_only_from_the_doors() -> None:
    offenders = back_doors(python_sources())
    assert offenders == [], "imports past the doors (use the door that re-exports the name):\n" + "\n".join(
        offenders
    )


def test_the_scanner_sees_each_way_of_importing_past_a_door(tmp_path: Path) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text(
        "Text.\n\n```python\nfrom tapekit import Tape\nimport tapekit.web\n```\n\n"
        "```python train\nimport tapekit.core as core\n\n\n"
        "def f():\n    from tapekit.web.miniwob import SPLIT\n```\n"
        "```bash\npython -c 'from tapekit.core import Tape'\n```\n"
    )
    text = guide.read_text()
    blocks = [(guide, text.count("\n", 0, b.start(1)) + 1, b.group(1)) for b in PYTHON_BLOCK.finditer(text)]
    assert back_doors(iter(blocks)) == [f"{guide}:9: tapekit.core", f"{guide}:13: tapekit.web.miniwob"]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def declared_all(source: str) -> list[str] | None:
    """The names a module's top-level ``__all__`` lists (None without one; [] if not literal)."""
    found: list[str] | None = None
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = getattr(node, "value", None)
            elements = value.elts if isinstance(value, ast.List | ast.Tuple) else []
            found = [*(found or []), *(e.value for e in elements if isinstance(e, ast.Constant))]
    return found


def all_outside_the_doors() -> dict[str, int]:
    """Module -> the size of its ``__all__``, for the modules of tapekit/ that are no door."""
    sizes = {}
    for path in sorted((ROOT / "tapekit").rglob("*.py")):
        names = declared_all(path.read_text())
        if names is not None and module_name(path) not in DOORS:
            sizes[module_name(path)] = len(names)
    return sizes


def test_only_the_doors_declare_all() -> None:
    outside = sorted(all_outside_the_doors().items(), key=lambda item: -item[1])
    assert outside == [], (
        f"{sum(n for _, n in outside)} names in __all__ outside the doors (an implementation module "
        "needs no __all__; re-export what users need from a door): "
        + ", ".join(f"{module} ({n})" for module, n in outside[:15])
    )


def test_declared_all_reads_each_way_of_writing_it() -> None:
    assert declared_all("x = 1\n") is None
    assert declared_all('__all__ = ["a", "b"]\n') == ["a", "b"]
    assert declared_all('__all__: tuple[str, ...] = ("a",)\n__all__ += ["b"]\n') == ["a", "b"]
    assert declared_all("__all__ = names()\n") == []


def test_every_door_is_a_module_and_every_face_declares_all() -> None:
    for door in DOORS:
        base = ROOT.joinpath(*door.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        assert path.exists(), door
        if door in FACES:
            assert declared_all(path.read_text()), f"{door} declares no __all__"


def binds(module: str, name: str) -> bool:
    """Whether ``module``'s source binds ``name`` at the top level (read, not imported)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
            (alias.asname or alias.name.split(".")[0]) == name for alias in node.names
        ):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def missing_names(door: types.ModuleType) -> list[str]:
    """The names in ``door.__all__`` that are not there. A lazy name (one the module's
    ``__getattr__`` loads) must be a key of one of its tables of names (``{name: module}``) and
    bound by that module, which is read rather than imported unless it is imported already."""
    missing = []
    tables = [
        table
        for table in vars(door).values()
        if isinstance(table, dict)
        and table
        and all(
            isinstance(k, str) and isinstance(v, str) and v.startswith("tapekit") for k, v in table.items()
        )
    ]
    for name in door.__all__:
        if name in vars(door):
            continue
        targets = {table[name] for table in tables if name in table}
        if name not in dir(door) or len(targets) != 1:
            missing.append(name)
            continue
        (target,) = targets
        loaded = sys.modules.get(target)
        if not (missing_names_in(loaded, name) == [] if loaded else binds(target, name)):
            missing.append(name)
    return missing


def missing_names_in(module: types.ModuleType, name: str) -> list[str]:
    """``missing_names`` for one name of an imported module (a lazy name's door may be lazy too)."""
    view = types.ModuleType(module.__name__)
    view.__dict__.update(vars(module))
    view.__all__ = [name]  # type: ignore[attr-defined]
    view.__dir__ = lambda: sorted({*dir(module), name})  # type: ignore[method-assign]
    return missing_names(view)


@pytest.mark.parametrize("door", [d for d in DOORS if d != "tapekit.studio"])
def test_every_name_a_door_declares_is_there(door: str) -> None:
    module = importlib.import_module(door)
    if hasattr(module, "__all__"):
        assert len(set(module.__all__)) == len(module.__all__), f"{door}.__all__ lists a name twice"
        assert missing_names(module) == []


def test_the_studio_declares_what_it_has() -> None:
    pytest.importorskip("fastapi")  # the studio extra
    assert missing_names(importlib.import_module("tapekit.studio")) == []


def test_a_missing_name_is_reported() -> None:
    door = types.ModuleType("tapekit_fake_door")
    door.here = 1  # type: ignore[attr-defined]
    door._WHERE = {"Tape": "tapekit.core", "NoSuchStep": "tapekit.core", "Unlisted": "tapekit.core"}  # type: ignore[attr-defined]
    door.__all__ = ["here", "Tape", "NoSuchStep", "gone"]  # type: ignore[attr-defined]
    door.__dir__ = lambda: ["here", "Tape", "NoSuchStep"]  # type: ignore[method-assign]
    assert missing_names(door) == ["NoSuchStep", "gone"]
