"""The math study's lenient scorer: a number copied out of the question earns nothing."""

from __future__ import annotations

from examples.math_study.agents import MathAnswer, MathPlan
from examples.math_study.scoring import lenient, strict
from tapekit import StepSequence, Tape, UserStep
from tapekit.evaluate import Task


def tape(question: str, plan: str, answer: str, well_formed: bool = True) -> Tape:
    steps = [
        UserStep(content=question),
        MathPlan(text=plan),
        MathAnswer(text=answer, well_formed=well_formed),
    ]
    return Tape(steps=StepSequence(steps))


def test_lenient_credits_the_number_anywhere_when_the_question_lacks_it() -> None:
    task = Task(id="p1", expected=19)
    t = tape("Ana has 12 apples and buys 7. How many?", "12+7 = 19", "about nineteen", well_formed=False)
    assert lenient(t, task).passed and not strict(t, task).passed


def test_lenient_does_not_credit_a_number_copied_from_the_question() -> None:
    task = Task(id="p2", expected=12)  # 12 is in the question: the plan merely repeats it
    t = tape("Ana has 12 apples, eats 3 and buys 3. How many?", "12-3+3", "Answer: 9")
    score = lenient(t, task)
    assert not score.passed and score.feedback == "number in the question; not in the final answer"
    assert lenient(
        tape("Ana has 12 apples, eats 3 and buys 3. How many?", "12-3+3", "Answer: 12"), task
    ).passed
