"""The form-filling study end to end: stored tree tapes open in the Studio, and the one command
(``examples/form_filler/run.py``) in a small setting, with the tuned student measured above the
zero-shot student on GREADTH."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from examples.form_filler.agents import make_teacher
from examples.form_filler.oracle import Oracle
from examples.form_filler.schema import load_form_set
from examples.form_filler.steps import PromptUserForTextMessageAction
from examples.form_filler.tree import TreeSettings, grow_tree
from tapekit import FunctionLLM, Tape
from tapekit.store import SQLiteStore

FORMS = load_form_set()


def test_tree_tapes_load_from_the_store_and_open_in_the_studio(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("jinja2")
    from fastapi.testclient import TestClient

    from tapekit.studio import create_app

    teacher = make_teacher(FunctionLLM(model_name="oracle", fn=Oracle(), stream_chunks=False))
    with SQLiteStore(tmp_path / "tree.db", flush_interval_s=0.005) as store:
        tree = grow_tree(
            teacher, FORMS.company("DriveCorp"), TreeSettings(intents=2, beam_width=3), store=store
        )
        store.flush()
        branch = tree.branches[-1]
        stored = store.get_tape(branch.tape.metadata.id, Tape)
        assert [s.llm_dict() for s in stored.steps] == [s.llm_dict() for s in branch.tape.steps]
        assert isinstance(stored.steps[-1], PromptUserForTextMessageAction)
        with TestClient(create_app(store), raise_server_exceptions=False) as client:
            listing = client.get("/tapes")
            assert listing.status_code == 200 and branch.tape.metadata.id in listing.text
            page = client.get(f"/tapes/{branch.tape.metadata.id}")
            assert page.status_code == 200
            assert "teacher.generate" in page.text and "prompt_user_for_text_message" in page.text
            assert branch.behavior in page.text, "the user's step names its behaviour"
            generate = next(
                i
                for i, s in enumerate(stored.steps)
                if s.metadata.node == "generate" and s.kind != "set_next_node"
            )
            step = client.get(f"/tapes/{branch.tape.metadata.id}/steps/{generate}")
            assert step.status_code == 200 and "Task: respond." in step.text and "oracle" in step.text


def test_quick_study_tunes_the_student_above_zero_shot(tmp_path: Path, capsys: Any) -> None:
    """The whole ``--quick`` study (about 6.5 minutes on 2 busy cores)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("trl")
    from examples.form_filler import run

    report = run.run(run.parse_args(["--quick", "--out", str(tmp_path)]))
    assert report.score(run.TEACHER).value == 1.0
    zero, tuned = report.score(run.ZERO_SHOT).value, report.score(run.TUNED).value
    assert zero == 0.0 and tuned >= zero, (zero, tuned)
    criteria = ["grounded", "responsive", "accurate", "disciplined", "transparent", "helpful"]
    mean = {a: sum(report.score(a, c).value for c in criteria) / 6 for a in (run.ZERO_SHOT, run.TUNED)}
    assert mean[run.TUNED] >= mean[run.ZERO_SHOT] + 0.1, mean
    out = capsys.readouterr().out
    assert re.search(r"stage=trees train_branches=\d+ test_branches=\d+ behaviours_in_both=19", out)
    assert (tmp_path / "greadth.json").exists()
