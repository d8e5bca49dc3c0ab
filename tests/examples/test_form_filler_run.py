"""The form-filling study end to end: stored tree tapes open in the Studio, and the one command
(``examples/form_filler/run.py``) in a small setting, with the tuned student measured above the
zero-shot student on GREADTH."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from examples.form_filler.agents import make_teacher
from examples.form_filler.oracle import ESTIMATED, Oracle
from examples.form_filler.schema import load_form_set
from examples.form_filler.steps import PromptUserForTextMessageAction
from examples.form_filler.tree import TreeSettings, grow_tree
from tapekit import FunctionLLM, Tape
from tapekit.store import SQLiteStore
from tests.conftest import needs_local_model

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


def test_synthetic_companies_are_valid_deterministic_and_new() -> None:
    from examples.form_filler.schema import FormSet, check_form_set
    from examples.form_filler.synthetic import synthetic_companies

    made = synthetic_companies(12, seed=3, avoid=FORMS)
    assert [c.model_dump() for c in made] == [c.model_dump() for c in synthetic_companies(12, 3, FORMS)]
    assert check_form_set(FormSet(train=made, test=[]), forms_per_company=10, all_kinds=True) == []
    names = [f.name for c in made for f in c.forms]
    assert len(set(names)) == len(names), "every made-up form has its own name"
    bundled = {f.name for c in [*FORMS.train, *FORMS.test] for f in c.forms}
    assert not bundled & set(names)
    slots = {p for c in made for f in c.forms for p in f.parameters.properties}
    assert len(slots) > 200, "slot names vary across forms"
    assert made[0].model_dump() != synthetic_companies(1, seed=4)[0].model_dump()
    with pytest.raises(ValueError, match="n must be"):
        synthetic_companies(-1)


# The CI setting of the one command: the --quick pipeline with fewer made-up training
# companies, narrower training trees, fewer SFT steps and one test continuation per behaviour
# (3.5 minutes at load ~3 on 2 cores; docs/form_filler.md quotes the full --quick run).
CI_ARGS = ["--quick", "--synthetic", "15", "--beam", "6", "--steps", "320", "--eval", "19"]


# The pipeline's mechanics at a budget of seconds: every stage runs and writes what it should
# (the learning claims are the studies below, run with pytest --studies).
TINY_ARGS = ["--quick", "--synthetic", "2", "--beam", "2", "--steps", "2", "--eval", "3"]


def test_the_one_command_runs_every_stage_at_a_tiny_budget(tmp_path: Path, capsys: Any) -> None:
    """Every stage, the two fairer baselines included (the untrained student held to its output
    grammar, and shown 2 worked examples per node from the training tapes): scored on the same
    turns, in greadth.json and in the paired comparisons; the grammar-held answers parse; the
    pass counts by what decided them add up; the teacher's tokens are counted or, without the
    embedded model, the output says they are estimated."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("trl")
    pytest.importorskip("llguidance")
    import jsonschema

    from examples.form_filler import run
    from examples.form_filler.greadth_rules import CRITERIA

    report = run.run(run.parse_args([*TINY_ARGS, "--out", str(tmp_path)]))
    assert report.score(run.TEACHER).value == 1.0  # the teacher passes every turn it is scored on
    agents = [run.TEACHER, run.ZERO_SHOT, run.GRAMMAR, run.FEW_SHOT, run.TUNED]
    assert report.agents == agents
    assert report.split == "val" and (tmp_path / "greadth.json").exists()
    paired = json.loads((tmp_path / "paired.json").read_text())
    assert [tuple(p) for p in paired["pairs"]] == [
        (run.TUNED, run.ZERO_SHOT),
        (run.TUNED, run.GRAMMAR),
        (run.TUNED, run.FEW_SHOT),
        (run.TUNED, run.TEACHER),
    ]
    assert set(paired["gap_closed_from"][run.TUNED]) == set(run.BASELINES)
    assert set(paired["cost_ratios"]) == set(agents) - {run.TEACHER}
    out = capsys.readouterr()
    assert re.search(r"stage=trees split=val train_branches=\d+", out.out)
    assert re.search(r"stage=zero_shot_grammar split=val continuations=3 ", out.out)
    assert re.search(r"stage=few_shot split=val k=2 demos=4 continuations=3 ", out.out)
    counting = report.token_counting[run.TEACHER]
    assert counting.startswith("counted by the SmolLM2") or (
        counting.startswith(ESTIMATED) and "warning: the teacher's tokens are estimated" in out.err
    )
    assert paired["token_counting"] == report.token_counting

    # the same turns for every agent
    messages = [[t.user_message for t in report.turns[a]] for a in agents]
    assert all(m == messages[0] for m in messages) and len(messages[0]) == 3

    # the grammar-held student's answers are JSON lists of the steps its nodes may write
    store = SQLiteStore(tmp_path / "tapes.db")
    checked = cut = 0
    for turn in report.turns[run.GRAMMAR]:
        tape = store.get_tape(turn.tape_id, Tape)
        for step in tape.steps[turn.user_index + 1 :]:
            call = store.llm_call_for_step(step)
            if call is None or step.kind == "set_next_node":
                continue
            schema = call.prompt.response_schema
            assert schema is not None and schema["$defs"]["action"]
            if call.tokens is not None and call.tokens.finish_reason == "length":
                cut += 1  # stopped at max_tokens: the grammar holds complete answers only
                continue
            jsonschema.Draft202012Validator(schema).validate(json.loads(call.output.content or ""))
            checked += 1
    assert checked >= 1
    unparsable = sum(any(f.rule == "unparsable" for f in t.findings) for t in report.turns[run.GRAMMAR])
    assert unparsable <= cut
    # the few-shot student's prompts: 2 demos for the node, no schema
    demos = json.loads((tmp_path / "few_shot.json").read_text())
    assert demos["k"] == 2 and len(demos["demos"]) == 4
    for turn in report.turns[run.FEW_SHOT]:
        tape = store.get_tape(turn.tape_id, Tape)
        call = next(c for s in tape.steps[turn.user_index + 1 :] if (c := store.llm_call_for_step(s)))
        roles = [m["role"] for m in call.prompt.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        assert call.prompt.response_schema is None
    store.close()

    # what decided each pass, in greadth.json: the counts add up to the passes
    saved = json.loads((tmp_path / "greadth.json").read_text())
    for agent in agents:
        sources = saved["summary"][agent]["pass_sources"]
        turns = report.turns[agent]
        for criterion in CRITERIA:
            c = sources[criterion]
            passed = sum(t.labels[criterion] for t in turns)
            assert c["rule"] + c["judge"] + c["rule+judge"] + c["default"] == c["passed"] == passed
            assert c["passed"] + c["failed"] == len(turns)
        g = sources["greadth"]
        assert g["all_decided"] + g["some_default"] == g["passed"] == sum(t.greadth for t in turns)
    assert "What decided each pass" in report.to_text()


@pytest.mark.study
def test_small_study_tunes_the_student_above_zero_shot(tmp_path: Path, capsys: Any) -> None:
    """Forms -> trees (all 19 behaviours) -> distillation -> GREADTH: the teacher passes every
    turn, the untrained student none, and the tuned student parses more turns and scores clearly
    higher on the six criteria."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("trl")
    from examples.form_filler import run

    report = run.run(run.parse_args([*CI_ARGS, "--out", str(tmp_path)]))
    assert report.score(run.TEACHER).value == 1.0
    # an untrained student passes no turn; the tuned one is held to a margin on the criteria below
    # (a bare "tuned >= zero" with zero == 0 could not fail)
    assert report.score(run.ZERO_SHOT).value == 0.0
    summary = report.summary()
    assert summary[run.ZERO_SHOT]["invalid"] == 19, "an untrained tiny model writes no valid JSON"
    assert summary[run.TUNED]["invalid"] <= 16, summary[run.TUNED]["invalid"]  # measured: 14
    criteria = ["grounded", "responsive", "accurate", "disciplined", "transparent", "helpful"]
    mean = {a: sum(report.score(a, c).value for c in criteria) / 6 for a in (run.ZERO_SHOT, run.TUNED)}
    assert mean[run.TUNED] >= mean[run.ZERO_SHOT] + 0.1, mean  # measured: 0.149 vs 0
    out = capsys.readouterr().out
    assert re.search(
        r"stage=trees split=val train_branches=\d+ eval_branches=\d+ behaviours_in_both=19 "
        r"synthetic_companies=15",
        out,
    )
    assert report.split == "val" and (tmp_path / "greadth.json").exists()
    paired = json.loads((tmp_path / "paired.json").read_text())
    assert paired["split"] == "val"
    assert [tuple(p) for p in paired["pairs"]] == [(run.TUNED, b) for b in (*run.BASELINES, run.TEACHER)]


# The case study's CI setting with the embedded SmolLM2-135M as the student (LoRA), chosen on the
# validation split (docs/experiments/form-filler-smollm2.md, "A CI setting"): the trees of 15
# made-up companies, 60 SFT steps at learning rate 2e-3, 19 validation turns. Measured: tuned
# 8 of 19 turns passing GREADTH against 0 of 19 zero-shot, about 6 minutes on 2 cores.
SMOLLM2_CI_ARGS = [
    "--quick", "--student", "smollm2", "--synthetic", "15", "--beam", "6", "--steps", "60", "--lr", "2e-3",
    "--eval", "19", "--threads", "2",
]  # fmt: skip


@pytest.mark.study
@needs_local_model
def test_smollm2_tuned_beats_its_zero_shot_self_on_the_validation_turns_its_setting_was_chosen_on(
    tmp_path: Path,
) -> None:
    """A regression check of the CI setting, not a held-out claim: SmolLM2 tuned on the teacher's
    tapes passes GREADTH on the 19 validation turns where the same model zero-shot passes none,
    and the paired exact test says the difference is real (p < 0.05 needs at least 6 turns won
    and none lost). The setting (60 steps, lr 2e-3) was chosen on these same validation turns,
    so this does not measure generalisation; the test-split figure is in
    docs/experiments/form-filler-smollm2.md."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from examples.form_filler import run

    report = run.run(run.parse_args([*SMOLLM2_CI_ARGS, "--out", str(tmp_path)]))
    assert report.score(run.TEACHER).value == 1.0
    assert report.score(run.ZERO_SHOT).value == 0.0  # SmolLM2 zero-shot writes prose, not the JSON steps
    paired = json.loads((tmp_path / "paired.json").read_text())
    assert paired["split"] == "val"
    tuned_vs_zero = next(c for c in paired["comparisons"] if (c["a"], c["b"]) == (run.TUNED, run.ZERO_SHOT))
    greadth = tuned_vs_zero["metrics"]["greadth"]
    assert greadth["n"] == 19 and greadth["b_only"] == 0
    assert greadth["p_value"] < 0.05 and greadth["difference"]["low"] > 0, greadth  # measured: 8 won, p 0.008
