"""The evaluation harness: k attempts per task through the batch runner, scorers side by side,
unbiased pass@k / pass^k, seeded bootstrap intervals, tokens and cost, store tags, rescoring."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest

from tapekit import (
    Action,
    Agent,
    AssistantThought,
    Node,
    Observation,
    Prompt,
    SetNextNode,
    StopStep,
    Tape,
    ToolEnvironment,
)
from tapekit.core import LLMOutput
from tapekit.environment import Environment
from tapekit.evaluate import (
    EvalReport,
    Score,
    Task,
    eval_tags,
    evaluate,
    pass_at_k,
    pass_hat_k,
    rescore,
)
from tapekit.llm.base import LLM, LLMEvent
from tapekit.store import MemoryStore, SQLiteStore, TapeFilter


class EvalNumber(Observation):
    kind: Literal["test_eval.number"] = "test_eval.number"
    value: int


class AnswerNode(Node):
    name: str = "answer"

    def make_prompt(self, agent: Any, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": str(tape.steps[0].value)}])

    def generate_steps(self, agent: Any, tape: Tape[Any, Any], llm_stream: Any) -> Any:
        yield AssistantThought(content=llm_stream.get_text())
        yield StopStep(reason="answered")


class FlakyDoubler(LLM):
    """Answers 2*n, except that the first ``wrong[n]`` calls for n answer 2*n+1. Reports 10
    prompt tokens and 3 output tokens per call, at prices that make a call cost 0.013."""

    model_name: str = "flaky"
    wrong: dict[int, int] = {}
    cost_per_prompt_token: float = 0.001
    cost_per_output_token: float = 0.001
    calls: int = 0

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return self._answer(prompt)

    async def _answer(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        object.__setattr__(self, "calls", self.calls + 1)
        n = int(prompt.messages[-1]["content"])
        left = self.wrong.get(n, 0)
        if left:
            self.wrong[n] = left - 1
        yield LLMEvent(
            output=LLMOutput(content=str(2 * n + (1 if left else 0))), prompt_tokens=10, output_tokens=3
        )


def exact(tape: Tape[Any, Any], task: Task) -> Score:
    got = tape.steps[-2].content
    ok = got == str(task.expected)
    return Score(value=float(ok), passed=ok, feedback=None if ok else f"expected {task.expected}, got {got}")


def lenient(tape: Tape[Any, Any], task: Task) -> bool:
    return abs(int(tape.steps[-2].content) - task.expected) <= 1


def make(wrong: dict[int, int]) -> tuple[Agent, ToolEnvironment, list[Task], FlakyDoubler]:
    llm = FlakyDoubler(wrong=dict(wrong))
    agent = Agent.create("doubler", llms=llm, nodes=[AnswerNode()])
    tasks = [
        Task(
            id=f"t{n}",
            start=Tape(steps=[EvalNumber(value=n)]),
            category="small" if n < 3 else "big",
            expected=2 * n,
        )
        for n in range(1, 6)
    ]
    return agent, ToolEnvironment([]), tasks, llm


def brute_pass_at(n: int, c: int, k: int, all_pass: bool) -> float:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    hits = [all(s) if all_pass else any(s) for s in subsets]
    return sum(hits) / len(subsets)


def test_estimators_match_enumeration_of_subsets() -> None:
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at(n, c, k, False))
                assert pass_hat_k(n, c, k) == pytest.approx(brute_pass_at(n, c, k, True))
    with pytest.raises(ValueError, match="k=4 needs"):
        pass_at_k(3, 1, 4)


def test_evaluate_k_attempts_scores_side_by_side_and_costs() -> None:
    # t1: 3 of 3 pass; t2: 2 of 3 (one wrong); t3: 0 of 3; t4, t5: all pass
    agent, env, tasks, llm = make({2: 1, 3: 3})
    report = evaluate(agent, env, tasks, {"exact": exact, "lenient": lenient}, k=3, name="dbl")
    assert llm.calls == 15 and len(report.samples) == 15
    assert len({s.tape_id for s in report.samples}) == 15  # k distinct tapes per task
    assert [(s.task_id, s.sample) for s in report.samples[:4]] == [("t1", 0), ("t1", 1), ("t1", 2), ("t2", 0)]
    per_task_c = {t: sum(s.scores["exact"].passed for s in g) for t, g in report.by_task().items()}
    assert per_task_c == {"t1": 3, "t2": 2, "t3": 0, "t4": 3, "t5": 3}
    assert report.pass_at_1().value == pytest.approx((1 + 2 / 3 + 0 + 1 + 1) / 5)
    assert report.pass_at_k().value == pytest.approx(4 / 5)  # pass@3 with n = 3
    assert report.pass_hat_k().value == pytest.approx(3 / 5)  # t2 and t3 are not reliable
    assert report.pass_hat(2).value == pytest.approx((1 + 1 / 3 + 0 + 1 + 1) / 5)
    # the lenient scorer forgives the off-by-one answers: a format-only gain shows as a gap
    assert report.pass_at_1("lenient").value == 1.0
    failures = report.failures()
    assert {f.task_id for f in failures} == {"t2", "t3"} and "expected 6, got 7" in failures[-1].scores[
        "exact"
    ].feedback
    # tokens and cost come from each tape's own LLM calls
    assert all(s.llm_calls == 1 and s.tokens == 13 for s in report.samples)
    assert len(report.llm_calls) == 15
    assert report.cost_per_attempt == pytest.approx(0.013) and report.total_tokens == 15 * 13
    assert report.tokens_per_task == 3 * 13 and report.cost_per_task == pytest.approx(3 * 0.013)
    # per-category breakdown
    cats = report.by_category()
    assert sorted(cats) == ["big", "small"] and cats["big"].pass_hat_k().value == pytest.approx(2 / 3)
    text = report.to_text()
    assert "pass^3" in text and "lenient" in text and "small" in text


def test_the_batch_options_on_llm_call_still_sees_every_call() -> None:
    agent, env, tasks, _ = make({})
    seen: list[Any] = []
    report = evaluate(agent, env, tasks, exact, k=2, on_llm_call=seen.append)
    assert len(seen) == 10 and {c.prompt.id for c in seen} == set(report.llm_calls)
    assert all(s.llm_calls == 1 and s.tokens == 13 for s in report.samples)  # and the costs are kept


def test_bootstrap_is_seeded_and_brackets_the_value() -> None:
    agent, env, tasks, _ = make({2: 1, 3: 3, 5: 2})
    report = evaluate(agent, env, tasks, exact, k=3, seed=7)
    a, b = report.pass_at_1(), report.pass_at_1()
    assert a == b and a.low <= a.value <= a.high and a.low < a.high
    fresh = EvalReport.model_validate_json(report.model_dump_json())
    assert fresh.pass_at_1() == a  # the same data and seed give the same interval in any process
    assert {str(report.model_copy(update={"seed": s, "n_bootstrap": 20}).pass_at_1()) for s in range(10)} != {
        str(a)
    }
    single = evaluate(*make({})[:2], tasks[:1], exact, k=2)
    # one task, passed: the exact interval of 1/1 ([0.025, 1]), not a zero-width [1, 1]
    assert single.pass_at_1().high == 1.0 and single.pass_at_1().low == pytest.approx(0.025)


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_store_tags_resume_and_rescore_make_no_llm_call(tmp_path: Any, backend: str) -> None:
    agent, env, tasks, llm = make({2: 1, 3: 3})
    with SQLiteStore(tmp_path / "eval.db") if backend == "sqlite" else MemoryStore() as store:
        report = evaluate(agent, env, tasks, exact, k=3, name="dbl", store=store)
        all_tag, passed_tag, failed_tag = eval_tags("dbl")
        assert len(store.list_tapes(TapeFilter(tag=all_tag))) == 15
        assert (
            len(store.list_tapes(TapeFilter(tag=failed_tag))) == 4
            and len(store.list_tapes(TapeFilter(tag=passed_tag))) == 11
        )
        assert len(store.list_tapes(TapeFilter(tag="eval:dbl:sample:2"))) == 5
        assert len(store.list_tapes(TapeFilter(tag="eval:dbl:task:t3"))) == 3
        calls = llm.calls

        # the same evaluation again: every attempt is read back from the store, none runs
        again = evaluate(agent, env, tasks, exact, k=3, name="dbl", store=store)
        assert llm.calls == calls
        assert again.pass_at_1() == report.pass_at_1() and again.total_cost == pytest.approx(
            report.total_cost
        )

        # a new scorer over the stored tapes: no LLM, the verdicts change, the costs stay
        def forgiving(tape: Tape[Any, Any], task: Task) -> Score:
            return Score(value=1.0, passed=True)

        for source, kwargs in ((store, {"name": "dbl"}), (report, {}), (list(report.tapes.values()), {})):
            re = rescore(source, {"forgiving": forgiving, "exact": exact}, tasks, **kwargs)
            assert llm.calls == calls
            assert re.pass_at_1("forgiving").value == 1.0
            assert re.pass_at_1("exact") == report.pass_at_1() and re.k == 3
            if source is not report.tapes:
                assert len(re.samples) == 15
        assert rescore(store, exact, tasks, name="dbl").total_cost == pytest.approx(report.total_cost)
        with pytest.raises(ValueError, match="no evaluation named 'nope'"):
            rescore(store, exact, tasks, name="nope")
        with pytest.raises(ValueError, match="not in tasks"):
            rescore(store, exact, tasks[:2], name="dbl")


def test_report_json_round_trip_and_summary(tmp_path: Any) -> None:
    agent, env, tasks, _ = make({3: 1})
    report = evaluate(agent, env, tasks, {"exact": exact, "lenient": lenient}, k=2)
    path = report.save(tmp_path / "report.json")
    data = json.loads(path.read_text())
    assert data["summary"]["exact"]["pass^2"]["value"] == pytest.approx(4 / 5)
    assert data["summary"]["lenient"]["tasks"] == 5
    loaded = EvalReport.load(path)
    assert loaded.pass_hat_k() == report.pass_hat_k() and loaded.tapes == {}
    with pytest.raises(ValueError, match="loaded from JSON"):
        rescore(loaded, exact, tasks)


def test_scorer_errors_and_bad_input_are_named() -> None:
    agent, env, tasks, _ = make({})

    def broken(tape: Tape[Any, Any], task: Task) -> Score:
        raise KeyError("missing field")

    report = evaluate(agent, env, tasks[:2], {"exact": exact, "broken": broken})
    assert report.pass_at_1("exact").value == 1.0 and report.pass_at_1("broken").value == 0.0
    assert report.samples[0].scorer_errors == ["broken"]
    assert "KeyError" in (report.samples[0].scores["broken"].feedback or "")
    with pytest.raises(ValueError, match="duplicate task id 't1'"):
        evaluate(agent, env, [tasks[0], tasks[0]], exact)
    with pytest.raises(ValueError, match="k must be a positive int"):
        evaluate(agent, env, tasks, exact, k=0)
    with pytest.raises(ValueError, match="neither a start tape nor a question"):
        evaluate(agent, env, [Task(id="x")], exact)
    with pytest.raises(KeyError, match="no scorer 'nope'"):
        report.pass_at_1("nope")


def test_async_scorer_and_question_tasks() -> None:
    import asyncio

    from tapekit import FunctionLLM
    from tapekit.evaluate import aevaluate

    class Echo(Node):
        name: str = "echo"

        def make_prompt(self, agent: Any, tape: Tape[Any, Any]) -> Prompt:
            return Prompt(messages=[{"role": "user", "content": tape.steps[0].content}])

        def generate_steps(self, agent: Any, tape: Tape[Any, Any], llm_stream: Any) -> Any:
            yield AssistantThought(content=llm_stream.get_text())
            yield StopStep()

    agent = Agent.create(
        "echo", llms=FunctionLLM(fn=lambda p: p.messages[-1]["content"].upper()), nodes=[Echo()]
    )

    async def judge(tape: Tape[Any, Any], task: Task) -> Score:
        ok = tape.steps[-2].content == task.expected
        return Score(value=float(ok), passed=ok, feedback="shouted" if ok else "whispered")

    tasks = [Task(id="a", question="hi", expected="HI"), Task(id="b", question="yo", expected="yo")]
    seen: list[str] = []
    report = asyncio.run(
        aevaluate(agent, ToolEnvironment([]), tasks, judge, on_sample=lambda s: seen.append(s.task_id))
    )
    assert sorted(seen) == ["a", "b"] and report.scorers == ["judge"]
    assert [s.scores["judge"].passed for s in report.samples] == [True, False]


class EvalLoad(Action):
    kind: Literal["test_eval.load"] = "test_eval.load"
    n: int


class EvalLoaded(Observation):
    kind: Literal["test_eval.loaded"] = "test_eval.loaded"
    value: int


class LoadThenAnswer(Node):
    """Asks the environment to load the task's number, then answers twice what it loaded."""

    name: str = "load_then_answer"

    def make_prompt(self, agent: Any, tape: Tape[Any, Any]) -> Prompt:
        loaded = [s for s in tape.steps if isinstance(s, EvalLoaded)]
        return Prompt(messages=[{"role": "user", "content": str(loaded[-1].value if loaded else 0)}])

    def generate_steps(self, agent: Any, tape: Tape[Any, Any], llm_stream: Any) -> Any:
        if not any(isinstance(s, EvalLoaded) for s in tape.steps):
            yield SetNextNode(next_node="load_then_answer")
            yield EvalLoad(n=tape.steps[0].value)
            return
        yield AssistantThought(content=llm_stream.get_text())
        yield StopStep(reason="answered")


class FailingLoads(Environment):
    """Loads each number, except that the first ``fails[n]`` loads of n fail as a hung page
    does: an observation marked as the environment's failure, with a value the agent gets
    wrong."""

    def __init__(self, fails: dict[int, int]) -> None:
        self.fails = dict(fails)

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        from tapekit.environment import ENVIRONMENT_FAILURE, unanswered_actions

        steps = []
        for action in unanswered_actions(tape):
            if self.fails.get(action.n, 0):
                self.fails[action.n] -= 1
                failed = EvalLoaded(value=-1)
                failed.metadata.other[ENVIRONMENT_FAILURE] = f"loading {action.n} did not finish within 30 s"
                steps.append(failed)
            else:
                steps.append(EvalLoaded(value=action.n))
        return tape.with_new_steps(steps, author="loads")


def test_attempts_the_environment_failed_are_marked_and_run_again_when_asked(tmp_path: Any) -> None:
    # a page that never loaded is the environment's failure, not the agent's: without retries the
    # attempt is scored (a fail) but marked and counted; with retries it runs again, and a resumed
    # evaluation reads every try back
    llm = FlakyDoubler()
    agent = Agent.create("loader", llms=llm, nodes=[LoadThenAnswer()])
    tasks = make({})[2]
    report = evaluate(agent, FailingLoads({2: 1, 3: 2}), tasks, exact)
    failed = {s.task_id: s.environment_failure for s in report.samples if s.environment_failure}
    assert failed == {t: f"loading {t[1]} did not finish within 30 s" for t in ("t2", "t3")}
    assert report.n_environment_failures == 2 and report.summary()["environment_failures"] == 2
    assert report.pass_at_1().value == pytest.approx(3 / 5)  # scored as they are: the default
    clean = report.without_environment_failures()
    assert clean.pass_at_1().value == 1.0 and clean.n_tasks == 3 and len(report.samples) == 5

    with SQLiteStore(tmp_path / "retry.db") as store:
        env = FailingLoads({2: 1, 3: 2})
        retried = evaluate(agent, env, tasks, exact, name="r", store=store, environment_retries=1)
        by_task = {s.task_id: s for s in retried.samples}
        assert [s.task_id for s in retried.samples] == ["t1", "t2", "t3", "t4", "t5"]
        assert by_task["t2"].environment_failure is None and by_task["t2"].environment_retries == 1
        assert by_task["t2"].scores["exact"].passed  # its second load worked
        assert by_task["t3"].environment_failure and by_task["t3"].environment_retries == 1  # failed twice
        assert by_task["t1"].environment_retries == 0 and retried.n_environment_failures == 1
        assert env.fails == {2: 0, 3: 0}
        assert len(store.list_tapes(TapeFilter(tag=eval_tags("r")[0]))) == 5  # the last try of each
        calls = llm.calls
        again = evaluate(agent, FailingLoads({}), tasks, exact, name="r", store=store, environment_retries=1)
        assert llm.calls == calls  # every round read back, none run again
        assert [(s.tape_id, s.environment_failure) for s in again.samples] == [
            (s.tape_id, s.environment_failure) for s in retried.samples
        ]
        assert rescore(store, exact, tasks, name="r").pass_at_1() == retried.pass_at_1()
    with pytest.raises(ValueError, match="environment_retries must be an int >= 0"):
        evaluate(agent, FailingLoads({}), tasks, exact, environment_retries=-1)
