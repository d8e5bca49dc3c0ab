"""An LLM playing the simulated users (examples/form_filler/llm_user.py, ``run.py --user-url``),
against a real local OpenAI-compatible HTTP server (tests/scripted_openai.py): its text becomes
the user's message, the behaviour's facts are kept, a tree grows with it, and an empty answer
falls back to the program's message, recorded."""

from __future__ import annotations

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
from tapekit.store import SQLiteStore

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


def test_only_the_scored_users_are_worded_and_an_earlier_student_is_scored_untrained(
    server: tuple[str, list[Any]], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--user-llm-on scored``: the training trees keep the programs' wording, the scored
    split's users are worded by the LLM. ``--tuned``: a second run scores the first run's
    student without training one, and it continues the same turns with the same steps."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("trl")
    from examples.form_filler import run

    url, _ = server
    grown: dict[str, Any] = {}
    real_grow = run.grow_trees

    def spy(teacher: Any, companies: Any, tree: Any, store: Any, name: str, users: Any = None) -> Any:
        grown[name] = users
        return real_grow(teacher, companies, tree, store, name, users)

    monkeypatch.setattr(run, "grow_trees", spy)
    tiny = ["--quick", "--synthetic", "2", "--beam", "2", "--steps", "2", "--eval", "3", "--no-baselines"]
    args = [*tiny, "--user-url", url, "--user-model", "user-sim", "--user-llm-on", "scored"]
    first = run.run(parse_args([*args, "--out", str(tmp_path / "a")]))
    assert grown["train-tree"] is None and grown["synthetic-tree"] is None
    assert isinstance(grown["val-tree"], LLMUser)
    assert "stage=users worded_by=user-sim on=scored" in capsys.readouterr().out
    scored_users = [t.user_message for t in first.turns[run.TEACHER]]
    assert len(scored_users) == 3 and all(m.startswith("You said: ") for m in scored_users)

    trained = next((tmp_path / "a").glob("sft-tiny/**/config.json")).parent
    second = run.run(parse_args([*args, "--tuned", str(trained), "--out", str(tmp_path / "b")]))
    assert not list((tmp_path / "b").glob("sft-*")), "--tuned must not train"
    assert f"stage=sft student=tuned reused={trained}" in capsys.readouterr().out

    def continued(report: Any, out: Path) -> list[list[dict[str, Any]]]:
        store = SQLiteStore(out / "tapes.db")
        try:
            tapes = [(store.get_tape(t.tape_id, Tape), t.user_index) for t in report.turns[run.TUNED]]
            return [[s.model_dump(exclude={"metadata"}) for s in tape.steps[i + 1 :]] for tape, i in tapes]
        finally:
            store.close()

    assert [t.user_message for t in second.turns[run.TUNED]] == scored_users
    assert continued(second, tmp_path / "b") == continued(first, tmp_path / "a")


def test_clean_reply() -> None:
    assert clean_reply('  User: "Make it expire on 2025-03-01."\n') == "Make it expire on 2025-03-01."
    assert clean_reply("  \n") == ""
