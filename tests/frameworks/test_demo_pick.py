"""pick_demos / DemoPick: which demos one prompt shows out of a node's pool."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tapekit.frameworks import Demo, DemoPick, pick_demos


def demo(goal: str, answer: str = "ok") -> Demo:
    d = Demo.chat(f"Goal: {goal}\nPage: ...", answer)
    d.inputs["match"] = goal
    return d


POOL = [
    demo('Click on the "Ok" button.', "a"),
    demo("Select Lorem, ipsum and click Submit.", "b"),
    demo('Click on the "Cancel" button.', "c"),
    demo("Enter the text dolor into the text field and press Submit.", "d"),
    demo("Select amet and click Submit.", "e"),
]


def answers(demos: list[Demo]) -> list[str]:
    return [d.outputs["assistant"] for d in demos]


def test_nearest_picks_the_demos_of_the_same_kind_of_goal_in_pool_order() -> None:
    pick = DemoPick(k=2, rule="nearest")
    assert answers(pick_demos(POOL, 'Click on the "Submit" button.', pick)) == ["a", "c"]
    assert answers(pick_demos(POOL, "Select sit, vel and click Submit.", pick)) == ["b", "e"]
    # the entering demo, then the best of the rest ("and", "submit") in pool order
    entering = "Enter the text foo into the text field and press Submit."
    assert answers(pick_demos(POOL, entering, pick)) == ["b", "d"]


def test_rare_words_outweigh_words_every_demo_has() -> None:
    # "submit" is in three of five demos, "text" and "field" in one: the entering demo wins
    (only,) = pick_demos(POOL, "text field Submit", DemoPick(k=1))
    assert only.outputs["assistant"] == "d"


def test_first_none_and_small_pools() -> None:
    assert answers(pick_demos(POOL, "anything", DemoPick(k=3, rule="first"))) == ["a", "b", "c"]
    assert answers(pick_demos(POOL, "anything", None)) == ["a", "b", "c", "d", "e"]
    assert answers(pick_demos(POOL[:2], "anything", DemoPick(k=5))) == ["a", "b"]
    # no shared word: the first k, deterministically
    assert answers(pick_demos(POOL, "zzz", DemoPick(k=2))) == ["a", "b"]


def test_match_text_falls_back_to_the_inputs() -> None:
    plain = Demo(inputs={"question": "What is double 3?"}, outputs={"answer": "6"})
    assert plain.match_text() == "What is double 3?"
    other = Demo(inputs={"question": "Name a colour."}, outputs={"answer": "red"})
    (got,) = pick_demos([other, plain], "What is double 7?", DemoPick(k=1))
    assert got is plain


def test_bad_picks_are_refused() -> None:
    with pytest.raises(ValidationError):
        DemoPick(k=0)
    with pytest.raises(ValidationError):
        DemoPick(rule="random")  # type: ignore[arg-type]
