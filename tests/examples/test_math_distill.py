"""The math distillation example: problems, calculator, oracle teacher, student reuse, and the
whole ``--quick`` pipeline showing the tiny student improving after SFT."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.math_study.agents import (
    SHORT_SYSTEM,
    STUDENT_SYSTEM,
    MathAnswer,
    MathPlan,
    Oracle,
    calculator,
    calculator_environment,
    make_student,
    make_teacher,
    parse_output,
    render_output,
    start_tape,
    student_messages,
)
from examples.math_study.problems import (
    ALL_LEVELS,
    DIFFICULTIES,
    HARDER,
    LEVELS,
    Operation,
    Problem,
    difficulty,
    make_problems,
    split_problems,
)
from examples.math_study.scoring import lenient, step_credit, strict, tasks_for
from tapekit import FunctionLLM, LLMOutput, ToolCall, ToolResult, main_loop
from tapekit.batch import batch

ROOT = Path(__file__).resolve().parents[2]
HAVE_TRAIN = all(
    importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers", "trl", "datasets")
)


def test_problems_are_deterministic_leveled_and_correct() -> None:
    problems = make_problems(300, seed=3)
    assert problems == make_problems(300, seed=3)
    assert problems != make_problems(300, seed=4)
    assert {p.category for p in problems} == set(LEVELS)
    assert len({p.question for p in problems}) == 300
    for p in problems:
        assert len(p.operations) == LEVELS[p.category]
        assert calculator(p.expression) == p.answer >= 0
        assert p.steps()[-1][3] == p.answer
        assert str(p.start) in p.question
    assert any("(" in p.expression for p in problems)  # precedence needs parentheses sometimes
    train, val, test = split_problems(50, 20, 12, seed=1)
    assert not {p.question for p in train} & {p.question for p in val + test}
    assert all(p.id.startswith("val-") for p in val) and all(p.id.startswith("test-") for p in test)


def _problem(category: str, start: int, *ops: tuple[str, int]) -> Problem:
    operations = tuple(Operation(op, n) for op, n in ops)
    return Problem("p", category, "?", start, operations, "", 0)


def test_difficulty_splits_levels_by_the_largest_number_met() -> None:
    assert difficulty(_problem("level1", 29, ("+", 30))) == "level1"
    assert difficulty(_problem("level2", 12, ("+", 7), ("*", 5))) == "level2-small"  # 19, 95
    assert difficulty(_problem("level2", 12, ("+", 8), ("*", 5))) == "level2-large"  # 20, 100
    on_the_way = _problem("level3", 40, ("*", 3), ("/", 4), ("-", 1))  # 120, then 30 and 29
    assert difficulty(on_the_way) == "level3-large"
    assert difficulty(_problem("level3", 40, ("/", 4), ("*", 3), ("+", 9))) == "level3-small"
    graded = {difficulty(p) for p in make_problems(600, seed=2)}
    assert graded == set(DIFFICULTIES)
    tasks = tasks_for(make_problems(30, seed=2), difficulty)
    assert {t.category for t in tasks} <= set(DIFFICULTIES)
    assert {t.category for t in tasks_for(make_problems(30, seed=2))} == set(LEVELS)


def test_harder_levels_come_only_when_asked_for() -> None:
    from collections import Counter

    assert not {p.category for p in make_problems(300, seed=5)} & set(HARDER)
    hard = make_problems(40, seed=5, categories=["level4", "level5"])
    assert Counter(p.category for p in hard) == {"level4": 20, "level5": 20}
    for p in hard:
        assert len(p.operations) == HARDER[p.category]
        assert calculator(p.expression) == p.answer >= 0
        assert difficulty(p) == p.category  # not split by size: the students fail them at any size
    train, val, _ = split_problems(100, 25, categories=list(ALL_LEVELS))
    assert Counter(p.category for p in val) == {c: 5 for c in ALL_LEVELS}
    assert not {p.question for p in train} & {p.question for p in val}
    assert split_problems(100, 25) == split_problems(100, 25, categories=list(LEVELS))
    with pytest.raises(ValueError, match="unknown problem category 'level6'"):
        make_problems(3, categories=["level6"])


def test_training_problems_in_level_proportions_never_held_out() -> None:
    from collections import Counter

    weights = {"level1": 1, "level2": 2, "level3": 3}
    train, val, test = split_problems(300, 60, 30, seed=0, train_weights=weights)
    assert Counter(p.category for p in train) == {"level1": 50, "level2": 100, "level3": 150}
    assert Counter(p.category for p in val) == {"level1": 20, "level2": 20, "level3": 20}
    assert Counter(p.category for p in test) == {"level1": 10, "level2": 10, "level3": 10}
    assert not {p.question for p in train} & {p.question for p in val + test}
    # the validation problems are the stream's after the first 300, less training arithmetic
    # (tests/examples/test_math_splits.py checks that in full)
    window = {p.question for p in make_problems(360, seed=0)[300:]}
    assert len(window & {p.question for p in val}) >= 50
    with pytest.raises(ValueError, match="train_weights"):
        split_problems(10, 5, train_weights={"level9": 1})


def test_calculator_evaluates_arithmetic_only() -> None:
    assert calculator("(12+7)*3-5") == 52
    assert calculator("7/2") == 3.5 and calculator("8/2") == 4
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        calculator("12+")
    with pytest.raises(ValueError, match="unsupported"):
        calculator("__import__('os')")
    with pytest.raises(ValueError, match="division by zero"):
        calculator("1/0")


def test_the_oracle_teacher_solves_every_problem_over_several_calculator_turns() -> None:
    problems = make_problems(60, seed=5)
    teacher = make_teacher(FunctionLLM(fn=Oracle(problems)))
    results = batch(teacher, calculator_environment(), [start_tape(p) for p in problems], max_loops=8)
    for problem, result, task in zip(problems, results, tasks_for(problems), strict=True):
        assert result.ok, result.error
        tape = result.tape
        assert strict(tape, task).passed and lenient(tape, task).passed
        calls = [s for s in tape.steps if isinstance(s, ToolCall)]
        assert len(calls) == len(problem.operations)
        assert [s.metadata.node for s in tape.steps if isinstance(s, MathPlan | MathAnswer)] == [
            "plan",
            "answer",
        ]
        assert {s.metadata.node for s in calls} == {"act"}
    assert len(teacher.make_training_text(results[0].tape)) == len(problems[0].operations) + 3


def test_the_student_reuses_a_teacher_tape_one_turn_per_calculator_call() -> None:
    problem = next(p for p in make_problems(30, seed=2) if len(p.operations) == 3)
    teacher = make_teacher(FunctionLLM(fn=Oracle([problem])))
    tape = main_loop(teacher, start_tape(problem), calculator_environment()).get_final_tape()
    student = make_student(FunctionLLM(fn=lambda prompt: "unused"))
    adapted, calls = student.reuse(tape)
    assert adapted.metadata.author_tape_id == tape.metadata.id
    assert {s.metadata.agent for s in adapted.steps if s.metadata.agent} == {"student"}
    assert [s.llm_dict() for s in adapted.steps if s.kind != "set_next_node"] == [
        s.llm_dict() for s in tape.steps if s.kind != "set_next_node"
    ]
    (a, op1, b, r1), (_, op2, c, r2), (_, op3, d, r3) = problem.steps()
    assert [c.output.content for c in calls] == [
        f"Plan: {a} {op1}{b} {op2}{c} {op3}{d}\ncalculator: {a}{op1}{b}",
        f"calculator: {r1}{op2}{c}",
        f"calculator: {r2}{op3}{d}",
        f"Answer: {r3}",
    ]
    # each call's prompt is the conversation so far, in the student's own format
    assert calls[-1].prompt.messages == student_messages(adapted[: len(adapted) - 2])
    assert [m["role"] for m in calls[1].prompt.messages] == ["system", "user", "assistant", "tool"]
    # replaying the student on its adapted tape's outputs gives the same tape
    replay = main_loop(
        make_student(
            FunctionLLM(fn=lambda p: next(c.output for c in calls if c.prompt.messages == p.messages))
        ),
        start_tape(problem),
        calculator_environment(),
    ).get_final_tape()
    assert [s.llm_dict() for s in replay.steps] == [s.llm_dict() for s in adapted.steps]


def test_student_system_message_short_by_default_and_instructions_on_request() -> None:
    problem = make_problems(3, seed=0)[0]
    seen: list[Any] = []

    def answer(prompt: Any) -> str:
        seen.append(prompt.messages[0])
        return f"Answer: {problem.answer}"

    for agent, system in (
        (make_student(FunctionLLM(fn=answer)), SHORT_SYSTEM),
        (make_student(FunctionLLM(fn=answer), STUDENT_SYSTEM), STUDENT_SYSTEM),
    ):
        tape = main_loop(agent, start_tape(problem), calculator_environment()).get_final_tape()
        assert seen[-1] == {"role": "system", "content": system}
        assert student_messages(tape, system)[0] == seen[-1]
    assert len(SHORT_SYSTEM) < len(STUDENT_SYSTEM) and "Plan:" in STUDENT_SYSTEM


def test_tiny_tokenizer_texts_are_the_rendered_turns() -> None:
    from examples.math_distill import tokenizer_texts

    problem = next(p for p in make_problems(30, seed=2) if len(p.operations) == 2)
    teacher = make_teacher(FunctionLLM(fn=Oracle([problem])))
    tape = main_loop(teacher, start_tape(problem), calculator_environment()).get_final_tape()
    adapted, _ = make_student(FunctionLLM(fn=lambda prompt: "unused")).reuse(tape)
    texts = tokenizer_texts([adapted])
    (a, op1, b, r1), (_, op2, c, r2) = problem.steps()
    assert texts == [
        f"system\n{SHORT_SYSTEM}",
        f"user\n{problem.question}",
        f"assistant\nPlan: {a} {op1}{b} {op2}{c}\ncalculator: {a}{op1}{b}",
        f"user\n[tool result] {r1}",
        f"assistant\ncalculator: {r1}{op2}{c}",
        f"user\n[tool result] {r2}",
        f"assistant\nAnswer: {r2}",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Plan: 3 +4\ncalculator: 3+4",
        "Plan: 3+4\ncalculator: 3+4",
        "Plan: 12 +7 *3 -5 /2",
        "calculator: 7*2",
        "Answer: 14",
        "Answer: fourteen",
        "",
        "Plan: 3 +4\nsome thoughts\nAnswer: 7",
        "rambling\ncalculator: 1+1\ncalculator: 2+2",
        "Plan: x",
    ],
)
def test_student_text_format_round_trips(text: str) -> None:
    steps = parse_output(text, first_call=1)
    assert render_output(steps) == text


def test_student_plan_is_the_operations_in_order() -> None:
    from examples.math_study.agents import MathPlan, plan_expression, plan_operations

    for problem in make_problems(60, seed=4):
        plan = plan_operations(problem.expression)
        assert plan == " ".join([str(problem.start), *(f"{o.op}{o.operand}" for o in problem.operations)])
        assert plan_expression(plan) == problem.expression
    plan_step = parse_output("Plan: 12 +7 *3 -5\ncalculator: 12+7", first_call=1)[0]
    assert isinstance(plan_step, MathPlan) and plan_step.text == "(12+7)*3-5"
    # an expression after "Plan:" is a thought: as a MathPlan it would render back otherwise
    assert parse_output("Plan: 3+4\ncalculator: 3+4", first_call=1)[0].kind == "assistant_thought"
    # a plan in another form stays as written, both ways
    assert plan_operations("12+7*3") == "12+7*3" and plan_expression("(3+4)") == "(3+4)"


def test_scorers_strict_and_lenient() -> None:
    problem = make_problems(3, seed=0)[0]
    (task,) = tasks_for([problem])
    student = make_student(FunctionLLM(fn=lambda p: LLMOutput(content=f"The answer is {problem.answer}")))
    tape = main_loop(student, start_tape(problem), calculator_environment()).get_final_tape()
    assert not strict(tape, task).passed and lenient(tape, task).passed
    wrong = make_student(FunctionLLM(fn=lambda p: f"Answer: {problem.answer + 1}"))
    tape = main_loop(wrong, start_tape(problem), calculator_environment()).get_final_tape()
    assert not strict(tape, task).passed and not lenient(tape, task).passed
    assert "expected" in (strict(tape, task).feedback or "")
    assert not any(isinstance(s, ToolResult) for s in tape.steps)


def _outcomes(problem: Problem, reply: str) -> tuple[bool, bool]:
    (task,) = tasks_for([problem])
    student = make_student(FunctionLLM(fn=lambda p: LLMOutput(content=reply)))
    tape = main_loop(student, start_tape(problem), calculator_environment()).get_final_tape()
    return strict(tape, task).passed, lenient(tape, task).passed


def test_an_exact_answer_always_passes_lenient_and_lenient_also_takes_other_formats() -> None:
    """The relation the two scorers must satisfy, tape by tape: strict passes => lenient passes
    (so lenient >= exact over any set of problems, by construction); lenient also takes the
    right number in another format, and not a number copied out of the question."""
    problems = make_problems(200, seed=0)
    plain = problems[0]  # "Nia has 26 shells. She sells 2. ...": 24 is not in the question
    copied = next(p for p in problems if f" {p.answer} " in f" {p.question} ")  # 25 / 5 ... = 5
    assert str(plain.answer) not in plain.question.split()
    cases = {
        (plain, f"Answer: {plain.answer}"): (True, True),
        (plain, f"The answer is {plain.answer}"): (False, True),  # lenient counts what exact rejects
        (plain, f"Answer: {plain.answer + 1}"): (False, False),
        (copied, f"Answer: {copied.answer}"): (True, True),
        (copied, f"I got {copied.answer}"): (False, True),  # in the final answer: counted
    }
    seen = {case: _outcomes(*case) for case in cases}
    assert seen == cases
    assert all(lenient_ok for strict_ok, lenient_ok in seen.values() if strict_ok)


def test_step_credit_counts_the_right_calls_in_order_plus_the_answer() -> None:
    problems = [p for p in make_problems(30, seed=2) if p.category == "level3"][:3]
    scorer = step_credit(problems)
    teacher = make_teacher(FunctionLLM(fn=Oracle(problems)))
    for problem, task in zip(problems, tasks_for(problems), strict=True):
        tape = main_loop(teacher, start_tape(problem), calculator_environment()).get_final_tape()
        assert scorer(tape, task).value == 1.0  # 3 right calls and the right answer
        (left, op, right, _), second = problem.steps()[0], problem.steps()[1]
        calls = [f"{left}{op}{right}", f"{second[0]}{second[1]}{second[2] + 1}", "1+1"]
        wrong = start_tape(problem)
        for k, expression in enumerate(calls):
            wrong = wrong.append(
                ToolCall(name="calculator", arguments={"expression": expression}, call_id=f"c{k}")
            )
        score = scorer(wrong, task)
        assert score.value == 0.25 and not score.passed  # 1 of 3 calls before the first wrong one, no answer
        assert score.feedback == "1/3 calls right"
    with pytest.raises(KeyError, match="no problem"):
        step_credit([])(tape, task)


STAGE = re.compile(
    r"^stage=(\w+) (?:student|teacher)=\S+ split=val n=45 exact=([\d.]+) exact_95ci=\[([\d.]+),([\d.]+)\]"
    r" lenient=([\d.]+) ",
    re.M,
)


def _quick_run(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``examples/math_distill.py --quick`` (with ``extra``) into ``out``; it must succeed. One
    torch thread: on a 2-core machine shared with other work it is the faster setting."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "math_distill.py"),
            "--quick",
            *extra,
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.skipif(not HAVE_TRAIN, reason="needs the train extra (torch, transformers, trl, datasets)")
def test_the_pipeline_runs_every_stage_at_a_tiny_budget(tmp_path: Path) -> None:
    """The mechanics (the learning claim is the study below, pytest --studies): teacher tapes,
    the zero-shot student, SFT for two steps and its evaluation, the table and the files."""
    done = _quick_run(tmp_path, "--train", "8", "--val", "4", "--steps", "2")
    stages = {m[1] for m in re.finditer(r"^stage=(\w+) \S+ split=val n=4 exact=", done.stdout, re.M)}
    assert stages == {"teacher", "zero_shot", "sft"}, done.stdout
    assert "math distillation" in done.stdout and (tmp_path / "tapes.db").is_file()
    assert {r["split"] for r in json.loads((tmp_path / "results.json").read_text())} == {"val"}


@pytest.mark.study
@pytest.mark.skipif(not HAVE_TRAIN, reason="needs the train extra (torch, transformers, trl, datasets)")
def test_quick_run_shows_the_tiny_student_improving(tmp_path: Path) -> None:
    done = _quick_run(tmp_path)
    stages: dict[str, Any] = {m[1]: (float(m[2]), float(m[5])) for m in STAGE.finditer(done.stdout)}
    for m in STAGE.finditer(done.stdout):  # pass@1 inside its 95 % interval
        assert float(m[3]) <= float(m[2]) <= float(m[4])
    assert set(stages) == {"teacher", "zero_shot", "sft"}, done.stdout
    assert stages["teacher"] == (1.0, 1.0)
    assert stages["zero_shot"][0] < 0.05
    # measured 0.49 on one machine and 0.58-0.62 on another on the 45 validation problems
    # (95 % intervals about +-14 points); 0.4 leaves a margin for that spread
    assert stages["sft"][0] >= 0.4, done.stdout
    # SFT taught the answer format: lenient (the right number anywhere) exceeds exact (the
    # right number as "Answer: <n>") by at most 0.15, i.e. 7 of 45 problems; measured 0.02 on
    # validation and 0.04 on test. (lenient >= exact cannot fail: an exact answer always holds
    # its number; the per-tape relation is checked in the test above.)
    assert stages["sft"][1] - stages["sft"][0] <= 0.15, done.stdout
    assert "math distillation" in done.stdout  # the table
    assert (tmp_path / "tapes.db").is_file()
    assert {r["split"] for r in json.loads((tmp_path / "results.json").read_text())} == {"val"}
