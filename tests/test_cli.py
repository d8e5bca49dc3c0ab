"""The ``tapekit`` command line: every example in every command's ``--help`` runs (offline, in a
fresh folder, as a real subprocess), and run / replay / export / import behave as documented."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from tapekit.cli import app
from tapekit.store import SQLiteStore, TapeFilter

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
OURS = {"run", "replay", "chat", "export", "import jsonl", "import reference"}
SERVERS = {"studio"}  # examples that start a server and never return


def commands() -> dict[str, Any]:
    """Every leaf command by its path (``import reference``)."""
    out: dict[str, Any] = {}

    def walk(cmd: Any, path: list[str]) -> None:
        if getattr(cmd, "commands", None):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        else:
            out[" ".join(path)] = cmd

    walk(typer.main.get_command(app), [])
    return out


def tapekit(*args: str, cwd: Path = ROOT, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "tapekit.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        input=stdin,
        timeout=180,
    )


def help_text(path: str) -> str:
    """``tapekit PATH --help``, in this process (the examples themselves run as subprocesses)."""
    from typer.testing import CliRunner

    out = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    return out.output


def examples(text: str) -> list[str]:
    """The ``$ tapekit ...`` lines of a help text (rich's panel borders stripped)."""
    lines = [line.strip().strip("│").strip() for line in text.splitlines()]
    return [line[2:] for line in lines if line.startswith("$ tapekit ")]


def test_the_new_commands_are_registered() -> None:
    assert set(commands()) >= OURS


@pytest.mark.parametrize("path", sorted(OURS))
def test_each_help_has_examples(path: str) -> None:
    found = examples(help_text(path))
    assert found, f"tapekit {path} --help shows no examples"
    assert all(e.startswith(f"tapekit {path.split()[0]}") or e.startswith("tapekit ") for e in found)


@pytest.mark.parametrize("path", sorted(set(commands()) - SERVERS))
def test_every_help_example_runs(path: str, tmp_path: Path) -> None:
    """Each command's examples run in order in a fresh folder (``../shared`` beside it points at
    the shared data, as in a CI checkout); each must exit 0."""
    found = examples(help_text(path))
    if not found:
        pytest.skip(f"tapekit {path} --help has no examples")
    work = tmp_path / "work"
    work.mkdir()
    if any("../shared" in e for e in found):
        if not SHARED.is_dir():
            pytest.skip(f"the examples read ../shared, which is not at {SHARED}")
        (tmp_path / "shared").symlink_to(SHARED)
    for example in found:
        args = shlex.split(example)[1:]
        out = tapekit(*args, cwd=work)
        assert out.returncode == 0, f"$ {example}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"


def test_run_prints_the_tape_and_stores_it(tmp_path: Path) -> None:
    question = "Tell me about Vulcan in 3 sentences"
    out = tapekit(
        "run", "tapekit.testing.analyst:team", question, "--db", "d.db", "--out", "t.json", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert f"environment                  observation user               {question}" in out.stdout
    assert "analyst/search_agent.search" in out.stdout and "stored as tape" in out.stderr
    tape = json.loads((tmp_path / "t.json").read_text())
    assert tape["steps"][-1]["kind"] == "assistant"
    with SQLiteStore(tmp_path / "d.db") as store:
        (tape_id,) = store.list_tapes(TapeFilter(tag="run"))
        assert store.get_tape_info(tape_id).n_steps == len(tape["steps"]) == 19
        assert len(store.list_llm_calls()) == 8
    as_json = tapekit("run", "tapekit.testing.analyst:team", "--tape", "t.json", "--json", cwd=tmp_path)
    assert json.loads(as_json.stdout)["steps"][0]["content"] == question
    bad = tapekit("run", "tapekit.testing.analyst:team", cwd=tmp_path)
    assert bad.returncode == 2 and "give either a QUESTION or --tape FILE" in bad.stderr
    bad = tapekit("run", "no_such_package.nowhere:team", "hi", cwd=tmp_path)
    assert bad.returncode == 2 and "cannot import 'no_such_package.nowhere'" in bad.stderr


VARIANT = """
from tapekit.testing.analyst import ENVIRONMENT, ActNode, make_analyst
from tapekit import AssistantStep


class ShoutingAct(ActNode):
    def generate_steps(self, agent, tape, llm_stream):
        for step in super().generate_steps(agent, tape, llm_stream):
            yield AssistantStep(content=step.content.upper()) if isinstance(step, AssistantStep) else step


def team():
    agent = make_analyst()
    agent.nodes[1] = ShoutingAct()
    return agent, ENVIRONMENT
"""


def test_replay_exits_1_with_a_diff_on_divergence(tmp_path: Path) -> None:
    question = "Tell me about Acme in 3 sentences"
    made = tapekit(
        "run", "tapekit.testing.analyst:team", question, "--db", "d.db", "--out", "t.json", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    ok = tapekit("replay", "tapekit.testing.analyst:team", "latest", "--db", "d.db", cwd=tmp_path)
    assert (
        ok.returncode == 0 and "replay ok: tapekit.testing.analyst:team made the same 19 steps" in ok.stdout
    )
    (tmp_path / "variant.py").write_text(VARIANT)  # the working folder is on the import path
    for args in (["latest", "--db", "d.db"], ["t.json"]):
        diverged = tapekit("replay", "variant:team", *args, cwd=tmp_path)
        assert diverged.returncode == 1, diverged.stdout + diverged.stderr
        assert "replay diverged at step 18" in diverged.stdout
        assert "+++ replayed" in diverged.stdout and "ACME" in diverged.stdout
    missing = tapekit("replay", "tapekit.testing.analyst:team", "nope.json", cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read nope.json" in missing.stderr


def test_export_and_import_round_trip(tmp_path: Path) -> None:
    assert (
        tapekit(
            "run", "tapekit.testing.analyst:team", "Tell me about Vulcan", "--db", "a.db", cwd=tmp_path
        ).returncode
        == 0
    )
    out = tapekit("export", "--db", "a.db", "--out", "x.jsonl", cwd=tmp_path)
    assert out.returncode == 0 and "wrote 1 tapes" in out.stdout
    out = tapekit("import", "jsonl", "x.jsonl", "--db", "b.db", cwd=tmp_path)
    assert out.returncode == 0 and "imported 1 tapes" in out.stdout
    with SQLiteStore(tmp_path / "a.db") as a, SQLiteStore(tmp_path / "b.db") as b:
        (tape_id,) = a.list_tapes()
        assert b.get_tape(tape_id).model_dump() == a.get_tape(tape_id).model_dump()
        assert sorted(b.list_llm_calls()) == sorted(a.list_llm_calls())
    bad = tapekit("export", "--db", "a.db", "--out", "y", "--format", "csv", cwd=tmp_path)
    assert bad.returncode == 2 and "choose jsonl or otlp" in bad.stderr


def test_run_replay_and_export_check_files_and_stores_before_any_work(tmp_path: Path) -> None:
    """The eval command's rule for every command: a bad input file, an output path that cannot be
    written and a store that cannot be opened are an ``error: ...`` with exit code 2, found
    before the agent runs or a store file is created."""
    team = "tapekit.testing.analyst:team"
    (tmp_path / "latin1.json").write_bytes(b'{"steps": [], "metadata": {"id": "caf\xe9"}}')
    cases = {
        ("run", team, "Tell me about Vulcan", "--out", "missing/t.json", "--db", "r.db"): (
            "--out missing/t.json: the folder missing does not exist"
        ),
        ("run", team, "--tape", "latin1.json", "--db", "r.db"): (
            "latin1.json, line 1: not valid UTF-8 (byte 0xe9 at column 38)"
        ),
        ("replay", team, "latin1.json"): "latin1.json, line 1: not valid UTF-8",
        ("replay", team, "latest", "--db", "r.db"): "--db r.db: no such store",
        ("export", "--db", "r.db", "--out", "x.jsonl"): "--db r.db: no such store",
        (
            "run",
            team,
            "Tell me about Vulcan",
            "--db",
            "missing/r.db",
        ): "cannot open the SQLite store missing/r.db",
    }
    for args, message in cases.items():
        out = tapekit(*args, cwd=tmp_path)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr and out.stdout == "", (args, out.stdout)  # nothing ran
        assert not (tmp_path / "r.db").exists(), args
    ran = tapekit("run", team, "Tell me about Vulcan", "--db", "r.db", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    out = tapekit("export", "--db", "r.db", "--out", "missing/x.jsonl", cwd=tmp_path)
    assert out.returncode == 2 and "--out missing/x.jsonl: the folder missing does not exist" in out.stderr


def test_train_names_a_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    config = tmp_path / "c.yaml"
    config.write_bytes(b"max_steps: 3\nmodel: caf\xe9\n")
    for kind in ("sft", "dpo", "rl"):
        out = CliRunner().invoke(app, ["train", kind, str(config)], env={"COLUMNS": "250"})
        assert out.exit_code == 2, (kind, out.output)
        assert f"{config}, line 2: not valid UTF-8 (byte 0xe9 at column 11)" in out.output, (kind, out.output)


def test_import_reference_from_the_command_line(tmp_path: Path) -> None:
    data = SHARED / "reference-data"
    if not data.is_dir():
        pytest.skip(f"no reference data at {data}")
    out = tapekit("import", "reference", str(data), "--db", "m.db", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("8 tapes (111 steps, 16 kinds), 34 LLM calls, 5 training texts")
    (tmp_path / "broken.json").write_text('{"metadata": {"id": "x"}, "steps": [{"metadata": {}}]}')
    bad = tapekit("import", "reference", "broken.json", "--db", "m.db", cwd=tmp_path)
    assert bad.returncode == 2 and "broken.json (tape x), step 0: the step has no 'kind'" in bad.stderr


def test_export_otlp_to_a_file_and_to_a_collector(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from tapekit.otel import tapes_from_otlp_json

    assert (
        tapekit(
            "run", "tapekit.testing.analyst:team", "Tell me about Acme", "--db", "a.db", cwd=tmp_path
        ).returncode
        == 0
    )
    out = tapekit("export", "--db", "a.db", "--format", "otlp", "--out", "spans.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (tape,) = tapes_from_otlp_json(json.loads((tmp_path / "spans.json").read_text()))
    with SQLiteStore(tmp_path / "a.db") as store:
        stored = store.get_tape(store.list_tapes()[0])
    assert [s.llm_dict() for s in tape.steps] == [s.llm_dict() for s in stored.steps]

    received: list[tuple[str, int]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, len(body)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        sent = tapekit("export", "--db", "a.db", "--format", "otlp", "--endpoint", url, cwd=tmp_path)
    finally:
        server.shutdown()
    assert sent.returncode == 0, sent.stderr
    assert "spans to" in sent.stdout and received and received[0][0] == "/v1/traces" and received[0][1] > 100


def test_flags_show_no_type_in_help(tmp_path: Path) -> None:
    """typer prints ``<bool>`` beside flags such as ``--json`` and ``--help``; the command the
    console script runs (``tapekit.cli:main``) leaves that column empty, for every command."""
    for path in ["run", "batch", "import reference", ""]:
        out = tapekit(*path.split(), "--help", cwd=tmp_path)
        assert out.returncode == 0 and "--help" in out.stdout, out.stderr
        assert "<bool>" not in out.stdout, path
    run_help = tapekit("run", "--help", cwd=tmp_path).stdout
    assert "<int>" in run_help  # options that take a value keep their type
