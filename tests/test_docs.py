"""Every Python snippet in the guides runs as written (each file's blocks in order)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_guide_snippets_run(path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert blocks, f"{path.name} has no Python examples"
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    exec(compile("\n".join(blocks), str(path), "exec", dont_inherit=True), namespace)
