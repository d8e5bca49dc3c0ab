"""An LLM playing the simulated users (examples/form_filler/llm_user.py, ``run.py --user-url``),
against a real local OpenAI-compatible HTTP server (tests/scripted_openai.py): its text becomes
the user's message, the behaviour's facts are kept, a tree grows with it, and an empty answer
falls back to the program's message, recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.scripted_openai as scripted
from examples.form_filler.agents import make_teacher
from examples.form_filler.behaviors import behavior
from examples.form_filler.environment import FormFillerEnvironment
from examples.form_filler.llm_user import LLMUser, clean_reply
from examples.form_filler.oracle import Oracle
from examples.form_filler.run import parse_args, user_llm
from examples.form_filler.schema import load_form_set
from examples.form_filler.steps import (
    InspectFunctionAction,
    PromptUserForTextMessageAction,
    RequestFunctionParametersThought,
)
from examples.form_filler.tree import TreeSettings, grow_tree, root_tape
from examples.form_filler.users import make_intent, respond
from tapekit import FunctionLLM, Tape
from tapekit.dialog import UserStep
from tapekit.llm.openai_compat import OpenAICompatibleLLM

SHOP = load_form_set().company("ShopCorp")
INTENT = make_intent(SHOP, "CreateDigitalCoupon", seed=1)


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with scripted.scripted_openai_server() as (url, requests):
        yield url, requests


def _llm(url: str) -> OpenAICompatibleLLM:
    return OpenAICompatibleLLM(model_name="user-sim", base_url=url, max_retries=0, timeout_s=10)


def _asking() -> Tape[Any, Any]:
    """A dialogue where the assistant has opened the coupon form and asks for its expiry date."""
    opened = FormFillerEnvironment(SHOP).react(
        root_tape("t", SHOP, 0).extend(
            [
                UserStep(content="I need to create a digital coupon."),
                InspectFunctionAction(function="CreateDigitalCoupon"),
            ]
        )
    )
    return opened.extend(
        [
            RequestFunctionParametersThought(function="CreateDigitalCoupon", parameters=["expiry_date"]),
            PromptUserForTextMessageAction(prompt="When should the coupon expire?"),
        ]
    )


def test_the_llm_words_the_turn_and_the_programs_facts_are_kept(server: tuple[str, list[Any]]) -> None:
    url, requests = server
    tape, wrong_date = _asking(), behavior("UserIncorrectDate")
    programmatic = respond(wrong_date, tape, INTENT, seed=3)
    step = LLMUser(_llm(url)).respond(wrong_date, tape, INTENT, seed=3)

    # the scripted model answers "You said: <the prompt>": the step's content is its text
    assert step.content.startswith("You said: You play a user") and step.content != programmatic.content
    prompt = requests[-1]["messages"][-1]["content"]
    assert step.content == "You said: " + prompt.strip()
    for shown in (programmatic.content, "When should the coupon expire?", "CreateDigitalCoupon", "ShopCorp"):
        assert shown in prompt, shown
    assert " ".join(wrong_date.description.split()) in prompt
    invalid = programmatic.metadata.other["facts"]["invalid"]
    assert invalid and all(str(v) in prompt for v in invalid.values()), invalid

    facts = step.metadata.other["facts"]
    assert {k: v for k, v in facts.items() if k not in ("user_llm", "programmatic_text")} == (
        programmatic.metadata.other["facts"]
    )
    assert facts["user_llm"] == "user-sim" and facts["programmatic_text"] == programmatic.content
    assert "user_llm_fallback" not in facts
    assert step.metadata.agent == "UserIncorrectDate"


def test_empty_llm_output_falls_back_to_the_program_and_says_so(
    server: tuple[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def empty(request: dict[str, Any]) -> list[dict[str, Any]]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": "  "}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        return [{**chunk, "choices": [choice]}, {**chunk, "choices": [], "usage": usage}]

    monkeypatch.setattr(scripted, "scripted_answer", empty)
    url, requests = server
    tape, happy = _asking(), behavior("UserHappyPath")
    step = LLMUser(_llm(url)).respond(happy, tape, INTENT)
    programmatic = respond(happy, tape, INTENT)
    assert requests, "the server was asked"
    assert step.content == programmatic.content
    assert step.metadata.other["facts"]["user_llm_fallback"] == "the LLM answered no text"


def test_a_failing_llm_falls_back_with_the_error_recorded() -> None:
    dead = OpenAICompatibleLLM(
        model_name="gone", base_url="http://127.0.0.1:9/v1", max_retries=0, timeout_s=2
    )
    tape, happy = _asking(), behavior("UserHappyPath")
    step = LLMUser(dead).respond(happy, tape, INTENT)
    assert step.content == respond(happy, tape, INTENT).content
    assert step.metadata.other["facts"]["user_llm_fallback"].startswith("the LLM failed: ")


def test_a_tree_grows_with_llm_users(server: tuple[str, list[Any]]) -> None:
    url, requests = server
    teacher = make_teacher(FunctionLLM(model_name="oracle", fn=Oracle(), stream_chunks=False))
    settings = TreeSettings(intents=2, branching=2, beam_width=3, max_turns=4)
    tree = grow_tree(teacher, SHOP, settings, name="t", user_llm=LLMUser(_llm(url)))
    assert {b.level for b in tree.branches} == {1, 2}
    users = [b.start.steps[-1] for b in tree.branches]
    assert len(requests) == len(users) == len(tree.branches)
    for step in users:
        facts = step.metadata.other["facts"]
        assert step.content.startswith("You said: ") and facts["user_llm"] == "user-sim"
        assert facts["behavior"] == step.metadata.agent and facts["programmatic_text"] in step.content
    plain = grow_tree(teacher, SHOP, settings, name="t")
    assert not {b.start.metadata.id for b in plain.branches} & {b.start.metadata.id for b in tree.branches}
    assert all("user_llm" not in b.start.steps[-1].metadata.other["facts"] for b in plain.branches)


def test_cli_options(tmp_path: Path) -> None:
    assert user_llm(parse_args([])) is None
    users = user_llm(parse_args(["--user-url", "http://127.0.0.1:1/v1", "--user-model", "sim"]))
    assert users is not None and users.model == "sim"
    scored = parse_args(["--user-url", "http://127.0.0.1:1/v1", "--user-llm-on", "scored"])
    assert scored.user_llm_on == "scored"
    (tmp_path / "adapter_config.json").write_text("{}")
    assert parse_args(["--tuned", str(tmp_path)]).tuned == tmp_path
    for wrong in (
        ["--user-model", "sim"],
        ["--user-llm-on", "scored"],  # no LLM to word anything
        ["--tuned", str(tmp_path / "nothing-here")],
        ["--tuned", str(tmp_path), "--filter-tapes", "both"],  # one student cannot stand for two
    ):
        with pytest.raises(SystemExit):
            parse_args(wrong)


class _Stop(Exception):
    """Raised where a test has seen what it needs, to end a study run early."""


def test_only_the_scored_users_are_worded(
    server: tuple[str, list[Any]], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--user-llm-on scored``: the training trees keep the programs' wording, the scored
    split's users are worded by the LLM (the run is stopped once the trees have grown)."""
    from examples.form_filler import run

    url, _ = server
    grown: dict[str, tuple[Any, list[Any]]] = {}
    real_grow = run.grow_trees

    def spy(teacher: Any, companies: Any, tree: Any, store: Any, name: str, users: Any = None) -> Any:
        branches = real_grow(teacher, companies, tree, store, name, users)
        grown[name] = (users, branches)
        return branches

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise _Stop

    monkeypatch.setattr(run, "grow_trees", spy)
    monkeypatch.setattr(run, "students", stop)
    tiny = ["--quick", "--synthetic", "1", "--eval", "2", "--no-baselines"]
    args = [*tiny, "--user-url", url, "--user-model", "user-sim", "--user-llm-on", "scored"]
    settings = parse_args([*args, "--out", str(tmp_path)])
    # small trees: the scripted server echoes its whole prompt, so worded turns grow fast
    small = TreeSettings(intents=1, branching=2, beam_width=2, max_turns=3)
    settings.train_tree = settings.val_tree = settings.synthetic_tree = small
    with pytest.raises(_Stop):
        run.run(settings)
    assert "stage=users worded_by=user-sim on=scored" in capsys.readouterr().out
    assert set(grown) == {"train-tree", "val-tree", "synthetic-tree"}
    for name in ("train-tree", "synthetic-tree"):
        users, branches = grown[name]
        assert users is None and branches
        assert all("user_llm" not in b.start.steps[-1].metadata.other["facts"] for b in branches)
    users, branches = grown["val-tree"]
    assert isinstance(users, LLMUser) and branches
    assert all(b.start.steps[-1].content.startswith("You said: ") for b in branches)


def test_an_earlier_student_is_scored_without_training(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--tuned DIR``: tune() loads the student from DIR and never trains."""
    from examples.form_filler import run

    (tmp_path / "config.json").write_text("{}")
    settings = parse_args(["--quick", "--tuned", str(tmp_path), "--out", str(tmp_path / "out")])
    loaded: list[tuple[Any, ...]] = []

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("--tuned must not train")

    monkeypatch.setattr(run, "train_student", no_training)
    monkeypatch.setattr(run, "student_samples", lambda *a: {"input_ids": [[1, 2, 3]]})

    def load(*args: Any) -> str:
        loaded.append(args)
        return "the tuned LLM"

    monkeypatch.setattr(run, "student_llm", load)
    before = FunctionLLM(fn=lambda prompt: "[]")
    after = run.tune(settings, settings.student, [], (before, None, None), run.TUNED)
    assert after == "the tuned LLM" and loaded == [(settings.student, str(tmp_path))]
    assert f"stage=sft student=tuned reused={tmp_path}" in capsys.readouterr().out


def test_clean_reply() -> None:
    assert clean_reply('  User: "Make it expire on 2025-03-01."\n') == "Make it expire on 2025-03-01."
    assert clean_reply("  \n") == ""


def test_the_worded_script_counts_worded_turns_and_their_passes(
    server: tuple[str, list[Any]], tmp_path: Path
) -> None:
    """scripts/form_filler_worded.py on a real store: a tree grown with LLM users, scored
    turns pointing at its tapes, passes counted per kind of user message."""
    import importlib.util

    from tapekit.store import SQLiteStore

    spec = importlib.util.spec_from_file_location(
        "worded", Path(__file__).parents[2] / "scripts" / "form_filler_worded.py"
    )
    assert spec is not None and spec.loader is not None
    worded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worded)

    url, _ = server
    teacher = make_teacher(FunctionLLM(model_name="oracle", fn=Oracle(), stream_chunks=False))
    store = SQLiteStore(tmp_path / "tapes.db")
    settings = TreeSettings(intents=2, branching=2, beam_width=3, max_turns=4)
    tree = grow_tree(teacher, SHOP, settings, name="t", store=store, user_llm=LLMUser(_llm(url)))
    store.close()
    branches = [b for b in tree.branches if b.error is None][:4]
    assert len(branches) == 4

    def turn(branch: Any, passed: bool) -> dict[str, Any]:
        index = len(branch.start.steps) - 1
        assert isinstance(branch.tape.steps[index], UserStep)
        finding = {"rule": "r", "criteria": ["accurate"], "passed": passed, "detail": "", "fatal": False}
        return {"tape_id": branch.tape.metadata.id, "user_index": index, "valid": True, "findings": [finding]}

    turns = {
        "teacher": [turn(b, True) for b in branches],
        "student": [turn(b, i == 0) for i, b in enumerate(branches)],
    }
    (tmp_path / "greadth.json").write_text(json.dumps({"turns": turns}))
    summary = worded.worded_summary(tmp_path)
    # the scripted server echoes its prompt, which holds every value: all worded, all faithful
    assert summary["tree"] == {"worded": len(tree.branches)}
    assert summary["scored"]["turns"] == summary["scored"]["worded"] == 4
    assert summary["scored"]["worded_with_every_value_verbatim"] == summary["scored"]["worded_with_values"]
    assert summary["greadth"]["teacher"]["worded"] == {"turns": 4, "passing": 4}
    assert summary["greadth"]["student"]["worded"] == {"turns": 4, "passing": 1}
    assert summary["greadth"]["student"]["fallback"] == {"turns": 0, "passing": 0}
