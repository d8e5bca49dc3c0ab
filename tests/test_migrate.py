"""Migration from the reference TapeAgents package: every file in ../shared/reference-data
(written by tapeagents 0.1.16) is imported into a real SQLite store, and the result is checked
against the counts, ids and links that the data's README lists."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tapekit import Tape, ToolCall, ToolResult
from tapekit.migrate import (
    GenericAction,
    GenericObservation,
    GenericThought,
    ReferenceFormatError,
    import_reference,
    read_training_texts,
    reference_tape,
    to_reference_tape,
)
from tapekit.store import SQLiteStore, TapeFilter

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parents[2] / "shared" / "reference-data"
if not (DATA / "README.md").is_file():
    pytest.skip(f"the reference data is not at {DATA} (../shared/reference-data)", allow_module_level=True)

TAPE_FILES = sorted((DATA / "tapes").glob("*.json"))
# the README's "Step kinds" table: tape id, number of top-level steps, counts by kind
EXPECTED = {
    "01_analyst_dialog_turn1": ("eeba76a7-5c23-4bd3-b1be-1863177bba3e", 19),
    "02_simulated_investor_own_tape": ("cb556dd2-f81a-4b66-b203-8be2e608db0c", 1),
    "03_analyst_dialog_continued_by_investor": ("0199503e-1683-47c8-afbc-3b0d8ceff452", 20),
    "04_analyst_dialog_turn2": ("81bea31f-3b1d-4df8-8147-fe50f2744e4b", 30),
    "05_calc_agent_custom_steps": ("350960f9-ddd6-448f-b0b5-a5b047761442", 14),
    "06_calc_agent_reused": ("c3739cdd-2718-4d3c-9926-619947ec7166", 14),
    "07_team_session": ("0ca3b5c4-da80-4d90-a4a3-ace684becd5c", 10),
    "08_quote_agent_error": ("72db9157-cfa1-4ec9-b556-28f7589cdb15", 3),
}
TOTALS = {
    "set_next_node": 32,
    "assistant": 19,
    "tool": 15,
    "user": 9,
    "call": 6,
    "respond": 6,
    "assistant_thought": 4,
    "compute_action": 4,
    "compute_result": 4,
    "answer_action": 2,
    "broadcast": 2,
    "llm_output_parsing_failure_action": 2,
    "plan_thought": 2,
    "task": 2,
    "final_step": 1,
    "make_observation": 1,
}
CUSTOM = {
    "compute_action",
    "compute_result",
    "answer_action",
    "broadcast",
    "llm_output_parsing_failure_action",
    "plan_thought",
    "task",
    "final_step",
    "make_observation",
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with SQLiteStore(tmp_path_factory.mktemp("migrate") / "imported.db") as store:
        report = import_reference([DATA], store)
        yield store, report


def test_every_file_is_read(imported: Any) -> None:
    _, report = imported
    assert len(TAPE_FILES) == 8
    read = {Path(p).name: what for p, what in report.files.items()}
    assert set(read) == {
        *(f.name for f in TAPE_FILES),
        "tapes.yaml",
        "tapedata.sqlite",
        "training_texts.json",
    }
    assert read["tapes.yaml"] == "8 tapes"
    assert read["tapedata.sqlite"] == "8 tapes, 34 LLM calls"
    assert read["training_texts.json"] == "5 training texts"
    assert all(read[f.name] == "1 tapes" for f in TAPE_FILES)


def test_counts_by_kind_match_the_readme(imported: Any) -> None:
    store, report = imported
    assert dict(report.step_kinds) == TOTALS
    assert sum(report.step_kinds.values()) == 111 and len(report.step_kinds) == 16
    assert sorted(report.tapes) == sorted(tape_id for tape_id, _ in EXPECTED.values())
    assert store.count_tapes(TapeFilter(tag="tapeagents")) == 8
    # per tape: the stored tape gives back exactly the file's steps (kinds, ids, fields)
    for path in TAPE_FILES:
        tape_id, n_steps = EXPECTED[path.stem]
        original = json.loads(path.read_text())
        stored = store.get_tape(tape_id)
        back = to_reference_tape(stored)
        assert len(back["steps"]) == n_steps
        assert back == original, path.name


def test_kinds_map_to_tapekit_classes(imported: Any) -> None:
    store, _ = imported
    tapes = [store.get_tape(tape_id) for tape_id, _ in EXPECTED.values()]
    steps = [s for t in tapes for s in t.steps]
    kinds = Counter(s.kind for s in steps)
    # 14 ToolCalls steps hold 15 calls: one tapekit tool_call each; 5 text answers stay assistant
    assert kinds["tool_call"] == 15 and kinds["assistant"] == 5
    assert kinds["tool_result"] == 15 and kinds["user"] == 9 and kinds["assistant_thought"] == 4
    assert kinds["set_next_node"] == 32 and kinds["call"] == 6 and kinds["respond"] == 6
    generic = [s for s in steps if isinstance(s, GenericThought | GenericAction | GenericObservation)]
    assert Counter(s.original_kind for s in generic) == {k: TOTALS[k] for k in CUSTOM}
    by_kind = {s.original_kind: s for s in generic}
    assert isinstance(by_kind["compute_action"], GenericAction)
    assert isinstance(by_kind["compute_result"], GenericObservation)
    assert by_kind["compute_result"].metadata.other["action_kind"] == "compute_action"
    assert by_kind["broadcast"].fields["from_"] == "Client/Manager" or "from_" in by_kind["broadcast"].fields
    nested = by_kind["make_observation"].fields["new_observation"]
    assert nested["kind"] == "user" and nested["metadata"]["id"]
    # tool results are paired with their calls by id, and name the tool
    turn2 = store.get_tape(EXPECTED["04_analyst_dialog_turn2"][0])
    calls = {s.call_id: s for s in turn2.steps if isinstance(s, ToolCall)}
    results = [s for s in turn2.steps if isinstance(s, ToolResult)]
    assert len(results) == 7 and all(r.call_id in calls and r.name == calls[r.call_id].name for r in results)
    parallel = [s for s in turn2.steps if isinstance(s, ToolCall) and s.metadata.id.endswith("#1")]
    assert len(parallel) == 1  # the one assistant step with two parallel calls


def test_ids_parent_links_and_metadata_are_kept(imported: Any) -> None:
    store, _ = imported
    ids = {name: tape_id for name, (tape_id, _) in EXPECTED.items()}
    t01, t03 = (
        store.get_tape_info(ids["01_analyst_dialog_turn1"]),
        store.get_tape_info(ids["03_analyst_dialog_continued_by_investor"]),
    )
    assert t03.parent_id == t01.id
    assert t03.author == "simulated_investor" and t03.author_tape_id == ids["02_simulated_investor_own_tape"]
    assert [a.id for a in store.ancestry(t03.id)] == [t01.id]
    t08 = store.get_tape_info(ids["08_quote_agent_error"])
    assert t08.parent_id == t08.id and t08.error.startswith("Agent loop exception")
    assert store.get_tape_info(ids["05_calc_agent_custom_steps"]).result == {
        "answer": 3.0,
        "expected": 3,
        "solved": True,
    }
    own = store.get_tape(ids["02_simulated_investor_own_tape"])
    assert own.context["metadata"]["id"] == t01.id and len(own.context["steps"]) == 19
    # shared prefixes keep their step ids across tapes
    a, b = store.get_tape(t01.id), store.get_tape(ids["04_analyst_dialog_turn2"])
    assert [s.metadata.id for s in a.steps[:19]] == [s.metadata.id for s in b.steps[:19]]
    assert b.steps[0].metadata.prompt_id == "" and b.steps[1].metadata.prompt_id.startswith("4666db7c")


def test_llm_calls_are_stored_under_the_step_prompt_ids(imported: Any) -> None:
    store, report = imported
    assert len(report.llm_calls) == 34 and len(store.list_llm_calls()) == 34
    step_pids = set()
    for tape_id, _ in EXPECTED.values():
        step_pids |= {s.metadata.prompt_id for s in store.get_tape(tape_id).steps if s.metadata.prompt_id}
    assert len(step_pids) == 33
    linked = {pid for pid in step_pids if store.get_llm_call(pid) is not None}
    assert len(linked) == 27  # six team-tape steps have prompt ids without a row
    call = store.get_llm_call("fab561b6-64dd-4314-b04a-62818bd1fe19")
    assert call.model == "gpt-4o-mini-2024-07-18" and call.prompt_tokens == 141 and call.output_tokens == 0
    assert call.output.tool_calls[0].name == "get_stock_ticker" and call.output.content is None
    assert len(call.prompt.tools) == 3 and call.prompt.messages[0]["role"] == "system"
    reused = store.get_llm_call("3f01c127-ffcc-494e-a1a0-f9d1536656e8")
    assert (
        reused.model == "" and reused.prompt_tokens == 0 and '"kind": "plan_thought"' in reused.output.content
    )
    totals = store.totals("tape")
    assert sum(t["calls"] for t in totals.values()) > 0
    with sqlite3.connect(DATA / "tapedata.sqlite") as conn:
        cost = conn.execute("SELECT SUM(cost) FROM LLMCalls").fetchone()[0]
    stored_cost = sum(store.get_llm_call(pid).cost for pid in store.list_llm_calls())
    assert stored_cost == pytest.approx(cost)


def test_training_texts_are_parsed_and_checked() -> None:
    texts = read_training_texts(DATA / "training_texts.json")
    assert len(texts) == 5
    assert all(t.output_text.endswith("<|eot_id|>") for t in texts)
    assert '"kind": "plan_thought"' in texts[0].output_text
    assert "<|start_header_id|>assistant<|end_header_id|>" in texts[0].prompt_text


def test_yaml_json_and_sqlite_copies_agree(tmp_path: Path) -> None:
    from tapekit.migrate import read_reference_file

    yaml_tapes = read_reference_file(DATA / "tapes.yaml").tapes
    sqlite_tapes = read_reference_file(DATA / "tapedata.sqlite").tapes
    json_tapes = [read_reference_file(p).tapes[0] for p in TAPE_FILES]
    as_data = [to_reference_tape(t) for t in json_tapes]
    assert [to_reference_tape(t) for t in yaml_tapes] == as_data
    by_id = {t.metadata.id: to_reference_tape(t) for t in sqlite_tapes}
    assert [by_id[d["metadata"]["id"]] for d in as_data] == as_data


def test_importing_again_changes_nothing_and_conflicts_are_named(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "again.db") as store:
        import_reference([DATA / "tapes"], store)
        before = {i: store.get_tape_info(i).n_steps for i in store.list_tapes()}
        again = import_reference([DATA / "tapes.yaml"], store)
        assert {i: store.get_tape_info(i).n_steps for i in store.list_tapes()} == before
        assert again.unchanged == again.tapes and len(again.tapes) == 8
        assert again.summary().endswith(
            "8 of the 8 tapes were already stored with the same content (not written again)"
        )
        changed = json.loads(TAPE_FILES[0].read_text())
        changed["steps"][2]["metadata"]["id"] = "another-id"
        bad = tmp_path / "changed.json"
        bad.write_text(json.dumps(changed))
        with pytest.raises(
            ReferenceFormatError,
            match=r"already stored in .* with other content: 1 tape; nothing was imported"
            r"(.|\n)*step 2 \(id 'another-id', kind 'set_next_node'\): metadata\.id is \"007c0951",
        ):
            import_reference([bad], store)


def test_bad_input_names_the_file_and_step(tmp_path: Path) -> None:
    broken = json.loads(TAPE_FILES[4].read_text())
    del broken["steps"][3]["kind"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    with SQLiteStore(tmp_path / "bad.db") as store:
        with pytest.raises(
            ReferenceFormatError, match=r"broken\.json \(tape 350960f9.*\), step 3: the step has no 'kind'"
        ):
            import_reference([path], store)
        (tmp_path / "notes.json").write_text("not json")
        with pytest.raises(ReferenceFormatError, match=r"notes\.json: not JSON"):
            import_reference([tmp_path / "notes.json"], store)
        with pytest.raises(ReferenceFormatError, match="no such file"):
            import_reference([tmp_path / "missing.json"], store)


def test_generic_steps_load_in_a_fresh_process(tmp_path: Path) -> None:
    """Stored imported tapes load wherever tapekit is imported (the generic kinds register with
    the package), without importing tapekit.migrate."""
    db = tmp_path / "fresh.db"
    with SQLiteStore(db) as fresh:
        import_reference([TAPE_FILES[4]], fresh)
    code = (
        "import sys; from tapekit.store import SQLiteStore\n"
        "s = SQLiteStore(sys.argv[1]); t = s.get_tape('350960f9-ddd6-448f-b0b5-a5b047761442')\n"
        "print(sorted({x.kind for x in t.steps})); s.close()"
    )
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "generic_action" in out.stdout and "generic_observation" in out.stdout


def test_the_studio_shows_the_prompt_behind_an_imported_step(imported: Any) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from tapekit.studio import create_app

    store, _ = imported
    tape_id = EXPECTED["04_analyst_dialog_turn2"][0]
    with TestClient(create_app(store), raise_server_exceptions=False) as client:
        page = client.get(f"/tapes/{tape_id}/steps/3")  # the first tool call, from LLMCalls row 2
        assert page.status_code == 200, page.text[-2000:]
        assert "Carry out the plan step by step" in page.text  # the prompt's last message
        assert "get_stock_ticker" in page.text and "gpt-4o-mini-2024-07-18" in page.text
        team = client.get(f"/tapes/{EXPECTED['07_team_session'][0]}/steps/9")  # final_step: generic
        assert team.status_code == 200 and "Termination message received" in team.text
        calc = client.get(f"/tapes/{EXPECTED['05_calc_agent_custom_steps'][0]}/steps/3")
        assert calc.status_code == 200 and "compute_action" in calc.text
        assert "stand-in/llama-3-style-8b-instruct" in calc.text


def test_reference_tape_round_trips_unknown_kinds_exactly() -> None:
    data = json.loads(TAPE_FILES[6].read_text())  # the team tape: broadcast, final_step, copy_output
    tape = reference_tape(data)
    assert isinstance(tape, Tape)
    again = Tape.model_validate_json(tape.model_dump_json())
    assert to_reference_tape(again) == data


# ---------------------------------------------------------------------------- metadata subclasses
# TapeAgents agents subclass TapeMetadata (GAIA: task, terminated, attempt_number, level, other;
# the web agents: task_name, seed, other) and the reference writes the subclass's fields as
# ordinary keys after its own seven. The fixtures below are the real files with such keys added
# as the reference would write them: tape 05 as a GAIA-like tape, tape 04 as a web-agent tape, and
# an extra step-metadata key (a StepMetadata subclass) on a generic step and on the ToolCalls step
# with two parallel calls.

CALC, TURN2 = EXPECTED["05_calc_agent_custom_steps"][0], EXPECTED["04_analyst_dialog_turn2"][0]
SUBCLASS_META = {
    CALC: {
        "task": {"Question": "How many 1.5 kg bags?", "Level": "2", "file_name": ""},
        "terminated": False,
        "attempt_number": 1,
        "level": 2,
        "task_id": "c61d22de-5f6c-4958-a7f6-5e9707bd3466",
        "other": {"timers": {"solve": 12.5}, "tags": ["retry"]},
    },
    TURN2: {"task_name": "workarena.servicenow.order-standard-laptop", "seed": 7, "other": {}},
}
SUBCLASS_STEP_META = {CALC: {3: {"duration_s": 0.42}}, TURN2: {25: {"duration_s": 1.5, "retries": [0]}}}


def _with_subclass_fields(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a reference tape) with the subclass fields above added, in the reference's order."""
    tape_id = data["metadata"]["id"]
    data["metadata"].update(SUBCLASS_META.get(tape_id, {}))
    for index, extra in SUBCLASS_STEP_META.get(tape_id, {}).items():
        data["steps"][index]["metadata"].update(extra)
    return data


def _subclass_fixture(fmt: str, folder: Path) -> Path:
    """One reference file of format ``fmt`` (json: a folder of the 8 tape files; yaml: the
    stream; sqlite: the database, its ``Tapes`` rows rewritten) holding the subclass fields."""
    if fmt == "json":
        out = folder / "tapes"
        out.mkdir()
        for path in TAPE_FILES:  # as save_json_tape writes: pydantic's JSON with a 4-space indent
            data = _with_subclass_fields(json.loads(path.read_text()))
            (out / path.name).write_text(json.dumps(data, indent=4, ensure_ascii=False))
        return out
    if fmt == "yaml":
        yaml = pytest.importorskip("yaml")
        docs = [_with_subclass_fields(d) for d in yaml.safe_load_all((DATA / "tapes.yaml").read_text())]
        out = folder / "tapes.yaml"
        with out.open("w") as f:  # stream_yaml_tapes' SafeDumper settings
            yaml.safe_dump_all(docs, f, default_flow_style=False, explicit_start=True, sort_keys=False)
        return out
    out = folder / "tapedata.sqlite"
    out.write_bytes((DATA / "tapedata.sqlite").read_bytes())
    with sqlite3.connect(out) as conn:  # metadata: compact pydantic JSON; steps: json.dumps
        rows = conn.execute("SELECT tape_id, metadata, steps FROM Tapes").fetchall()
        for tape_id, meta, steps in rows:
            data = _with_subclass_fields({"metadata": json.loads(meta), "steps": json.loads(steps)})
            conn.execute(
                "UPDATE Tapes SET metadata = ?, steps = ? WHERE tape_id = ?",
                (json.dumps(data["metadata"], separators=(",", ":")), json.dumps(data["steps"]), tape_id),
            )
    conn.close()
    return out


def _expected(tape_id: str) -> dict[str, Any]:
    name = next(name for name, (i, _) in EXPECTED.items() if i == tape_id)
    return _with_subclass_fields(json.loads((DATA / "tapes" / f"{name}.json").read_text()))


@pytest.mark.parametrize("fmt", ["json", "yaml", "sqlite"])
def test_metadata_subclass_fields_are_kept_in_every_format(fmt: str, tmp_path: Path) -> None:
    source = _subclass_fixture(fmt, tmp_path)
    with SQLiteStore(tmp_path / "sub.db") as store:
        report = import_reference([source], store)
        assert len(report.tapes) == 8 and not report.unchanged
        for tape_id, extra in SUBCLASS_META.items():
            stored = store.get_tape(tape_id)
            assert stored.metadata.other == {"tapeagents": extra}
            assert store.get_tape_info(tape_id).other == {"tapeagents": extra}
            assert to_reference_tape(stored) == _expected(tape_id)  # the file's data, nothing lost
            assert list(to_reference_tape(stored)["metadata"]) == list(_expected(tape_id)["metadata"])
        calc = store.get_tape(CALC)
        assert calc.metadata.result == {"answer": 3.0, "expected": 3, "solved": True}  # not mixed up
        assert calc.steps[3].metadata.other["tapeagents"]["metadata"] == {"duration_s": 0.42}
        # the ToolCalls step with two calls is two ToolCall steps, each with the extra key
        turn2 = store.get_tape(TURN2)
        parallel = [
            s for s in turn2.steps if isinstance(s, ToolCall) and s.metadata.prompt_id.startswith("28ffcfd2")
        ]
        assert len(parallel) == 2
        assert all(s.metadata.other["tapeagents"]["metadata"]["retries"] == [0] for s in parallel)
        # an untouched tape gets no metadata.other
        assert store.get_tape_info(EXPECTED["07_team_session"][0]).other == {}
        # and importing the same file again is a no-op, not a conflict
        assert import_reference([source], store).unchanged == report.tapes


def test_metadata_subclass_copies_in_the_three_formats_agree(tmp_path: Path) -> None:
    files = [_subclass_fixture(fmt, tmp_path) for fmt in ("json", "yaml", "sqlite")]
    with SQLiteStore(tmp_path / "all.db") as store:
        report = import_reference(files, store)
        assert len(report.tapes) == 8 and store.count_tapes() == 8
        assert to_reference_tape(store.get_tape(CALC)) == _expected(CALC)


def test_metadata_subclass_fields_survive_a_jsonl_export(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "a.db") as a, SQLiteStore(tmp_path / "b.db") as b:
        import_reference([_subclass_fixture("json", tmp_path)], a)
        a.export_jsonl(tmp_path / "out.jsonl")
        b.import_jsonl(tmp_path / "out.jsonl")
        assert to_reference_tape(b.get_tape(CALC)) == _expected(CALC)


def test_the_studio_shows_metadata_subclass_fields(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from tapekit.studio import create_app

    with SQLiteStore(tmp_path / "studio.db") as store:
        import_reference([_subclass_fixture("json", tmp_path)], store)
        with TestClient(create_app(store), raise_server_exceptions=False) as client:
            page = client.get(f"/tapes/{CALC}")
            assert page.status_code == 200, page.text[-2000:]
            for text in ("task_id", "c61d22de-5f6c-4958-a7f6-5e9707bd3466", "attempt_number", "timers"):
                assert text in page.text, text
            assert "&#34;solved&#34;: true" in page.text or '"solved": true' in page.text  # the result too
            step = client.get(f"/tapes/{CALC}/steps/3")
            assert step.status_code == 200 and "duration_s" in step.text


# ---------------------------------------------------------------------------- changed tapes


def _changed_calc_tape(folder: Path, change: Any) -> Path:
    data = json.loads(TAPE_FILES[4].read_text())
    change(data)
    path = folder / "changed" / "05_calc_agent_custom_steps.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=4))
    return path


def test_reimporting_a_changed_tape_is_refused_naming_the_difference(tmp_path: Path) -> None:
    """Same tape id, same step ids, other content: the import stops, names the tape, the step and
    the field, and stores nothing (not even the other tapes of that import)."""
    with SQLiteStore(tmp_path / "s.db") as store:
        import_reference([TAPE_FILES[4]], store)
        original = to_reference_tape(store.get_tape(CALC))
        value = _changed_calc_tape(tmp_path, lambda d: d["steps"][5].update(value=4.0))
        new_tape = tmp_path / "changed" / TAPE_FILES[7].name  # a new tape in the same import
        new_tape.write_text(TAPE_FILES[7].read_text())
        with pytest.raises(ReferenceFormatError) as e:
            import_reference([value.parent], store)
        message = str(e.value)
        assert f"tape {CALC} from {value}" in message and "nothing was imported" in message
        step_id = original["steps"][5]["metadata"]["id"]
        assert (
            f"step 5 (id '{step_id}', kind 'compute_result'): value is 3.5 in the store but 4.0 in {value}"
            in message
        )
        assert to_reference_tape(store.get_tape(CALC)) == original  # the old content, as it was
        assert store.list_tapes() == [CALC]  # the new tape of that import was not stored either

        meta = _changed_calc_tape(tmp_path, lambda d: d["metadata"]["result"].update(solved=False))
        with pytest.raises(
            ReferenceFormatError, match=r"metadata\.result\.solved is true in the store but false"
        ):
            import_reference([meta], store)
        extra = _changed_calc_tape(tmp_path, lambda d: d["metadata"].update(level=3))
        with pytest.raises(ReferenceFormatError, match=r"metadata\.level is absent in the store but 3"):
            import_reference([extra], store)
        longer = _changed_calc_tape(tmp_path, lambda d: d["steps"].append(d["steps"][-1]))
        with pytest.raises(ReferenceFormatError, match=r"the number of steps is 14 in the store but 15"):
            import_reference([longer], store)
        assert to_reference_tape(store.get_tape(CALC)) == original


def test_two_copies_of_a_tape_that_differ_name_the_difference(tmp_path: Path) -> None:
    changed = _changed_calc_tape(tmp_path, lambda d: d["steps"][3].update(expression="250 * 14"))
    with SQLiteStore(tmp_path / "s.db") as store:
        with pytest.raises(
            ReferenceFormatError,
            match=rf"tape {CALC} differs between .*05_calc_agent_custom_steps\.json and .*changed.*: "
            r"step 3 \(id '[^']+', kind 'compute_action'\): expression is \"250 \* 14 / 1000\"",
        ):
            import_reference([TAPE_FILES[4], changed], store)
        assert store.count_tapes() == 0


def test_the_command_line_reports_a_changed_tape_and_an_unchanged_one(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run(
            [sys.executable, "-m", "tapekit.cli", "import", "reference", *args, "--db", "m.db"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=180,
        )

    first = cli(str(TAPE_FILES[4]))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("1 tapes (14 steps, 8 kinds), 0 LLM calls, 0 training texts")
    again = cli(str(TAPE_FILES[4]), "--tag", "again")
    assert again.returncode == 0, again.stderr
    assert "1 of the 1 tapes were already stored with the same content (not written again)" in again.stdout
    changed = _changed_calc_tape(tmp_path, lambda d: d["steps"][13].update(value=4.0))
    bad = cli(str(changed))
    assert bad.returncode == 2 and bad.stdout == ""
    assert "error: already stored in m.db with other content: 1 tape; nothing was imported" in bad.stderr
    assert (
        "step 13 (id " in bad.stderr
        and "kind 'answer_action'): value is 3.0 in the store but 4.0" in bad.stderr
    )
    with SQLiteStore(tmp_path / "m.db") as store:
        assert store.get_tape_info(CALC).tags == ["again", "tapeagents"]
        assert store.get_tape(CALC).steps[13].fields["value"] == 3.0


def test_yaml_timestamps_read_as_the_json_copy_writes_them(tmp_path: Path) -> None:
    """A datetime field of a metadata subclass is a YAML timestamp in the stream (the reference
    dumps ``model_dump()``) and an ISO string in the JSON file: both copies are the same tape."""
    yaml = pytest.importorskip("yaml")
    import datetime

    data = json.loads(TAPE_FILES[7].read_text())
    data["metadata"]["started_at"] = datetime.datetime(2026, 11, 23, 10, 0, 5)
    (tmp_path / "tape.yaml").write_text(yaml.safe_dump(data, explicit_start=True, sort_keys=False))
    data["metadata"]["started_at"] = "2026-11-23T10:00:05"  # pydantic's JSON of that datetime
    (tmp_path / "tape.json").write_text(json.dumps(data, indent=4))
    assert "started_at: 2026-11-23 10:00:05" in (tmp_path / "tape.yaml").read_text()
    with SQLiteStore(tmp_path / "s.db") as store:
        report = import_reference([tmp_path / "tape.yaml", tmp_path / "tape.json"], store)
        assert report.tapes == [data["metadata"]["id"]]
        assert to_reference_tape(store.get_tape(report.tapes[0])) == data
