"""Every Python snippet in the guides runs as written (each file's blocks in order)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_guide_snippets_run(path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert blocks, f"{path.name} has no Python examples"
    # a real module, as a user's script would be: pydantic looks classes' modules up
    module = types.ModuleType(f"tapekit_docs_{path.stem}")
    sys.modules[module.__name__] = module
    try:
        exec(compile("\n".join(blocks), str(path), "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[module.__name__]
