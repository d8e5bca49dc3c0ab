"""Write the README's layout table from the package's own docstrings.

Each public top-level module and package of ``tapekit`` (a name without a leading underscore)
gets one row: its path and the first sentence of its docstring. The rows sit in README.md
between ``<!-- layout:start -->`` and ``<!-- layout:end -->``; ``tests/test_layout.py`` checks
that the README holds exactly what this script writes, so the map cannot go stale.

    python scripts/layout_table.py          # rewrite the table in README.md
    python scripts/layout_table.py --check  # exit 1 if README.md differs
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tapekit"
START, END = "<!-- layout:start -->", "<!-- layout:end -->"


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    if not first:
        raise SystemExit(f"{path.relative_to(ROOT)} has no docstring: the layout table needs one")
    cut = first.find(". ")
    return (first[: cut + 1] if cut > 0 else first).replace("|", "\\|")


def public_entries() -> list[tuple[str, Path]]:
    """``(shown path, file holding its docstring)`` for each public top-level module/package."""
    entries = []
    for item in sorted(PACKAGE.iterdir()):
        if item.name.startswith("_"):
            continue
        if item.is_dir() and (item / "__init__.py").is_file():
            entries.append((f"tapekit/{item.name}/", item / "__init__.py"))
        elif item.suffix == ".py":
            entries.append((f"tapekit/{item.name}", item))
    return entries


def table() -> str:
    """The Markdown table, one row per public module or package."""
    rows = ["| path | what |", "|---|---|"]
    rows += [f"| `{shown}` | {_summary(path)} |" for shown, path in public_entries()]
    return "\n".join(rows)


def readme_with_table(text: str) -> str:
    """``text`` (the README) with the generated table between the markers."""
    if START not in text or END not in text:
        raise SystemExit(f"README.md lacks the {START} / {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if README.md differs")
    args = parser.parse_args()
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = readme_with_table(text)
    if args.check:
        if new != text:
            print("README.md's layout table is stale: run python scripts/layout_table.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
