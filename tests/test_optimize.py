"""optimize(): the demo, instruction and reflective optimisers on a deterministic stand-in
model, the rollout budget, per-node targets, store tags, the saved config and resumption."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tapekit import Agent, FunctionLLM, Prompt, Tape, TapeFilter, UserStep, main_loop, open_store
from tapekit.core import StepSequence
from tapekit.environment import ToolEnvironment
from tapekit.evaluate import Score, Task
from tapekit.frameworks.function import InputField, LLMFunctionNode, OutputField, StepSource
from tapekit.optimize import (
    AddDemos,
    BootstrapFewShot,
    InstructionSearch,
    OptimizeError,
    Reflective,
    candidate_tag,
    load_optimized,
    optimisable_nodes,
    optimize,
    pareto_front,
)

BASE_INSTRUCTION = "Answer the question."


def stand_in(prompt: Prompt) -> str:
    """Doubles the number in the question. Left to itself it only manages even numbers; it
    doubles every number when its instruction says 'double' or when a demo shows a doubling."""
    system = prompt.messages[0]["content"]
    n = int(re.findall(r"-?\d+", prompt.messages[-1]["content"])[-1])
    demos = [m["content"] for m in prompt.messages[1:-1] if m["role"] == "assistant"]
    skilled = "double" in system.lower() or bool(demos)
    value = 2 * n if (skilled or n % 2 == 0) else n
    return f"Reasoning: the number is {n}\nAnswer: {value}"


def make_agent(llm: Any = None) -> Agent:
    node = LLMFunctionNode(
        name="answer",
        instruction=BASE_INSTRUCTION,
        inputs=[InputField(name="question", prefix="Question")],
        outputs=[OutputField.rationale("answer"), OutputField(name="answer")],
        sources={"question": StepSource(kind="user")},
    )
    return Agent.create("doubler", llms=llm or FunctionLLM(fn=stand_in), nodes=[node])


def exact(tape: Tape[Any, Any], task: Task) -> Score:
    got = tape.steps[-1].content if tape.steps and tape.steps[-1].kind == "assistant" else None
    ok = got == str(task.expected)
    n = task.metadata["n"]
    feedback = None if ok else f"expected {task.expected} but got {got}: the answer must be twice {n}"
    return Score(value=float(ok), passed=ok, feedback=feedback)


def tasks(numbers: list[int], prefix: str) -> list[Task]:
    return [
        Task(id=f"{prefix}{n}", question=f"What is double {n}? {n}", expected=2 * n, metadata={"n": n})
        for n in numbers
    ]


TRAIN = tasks([2, 3, 4, 5, 6, 8], "train")
VAL = tasks([1, 7, 9, 10], "val")  # the base agent gets only 10 right: 0.25


def reflector_fn(prompt: Prompt) -> str:
    text = prompt.messages[-1]["content"]
    if "twice" in text:
        return (
            "The node answers odd numbers unchanged.\n```\nDouble the number and give only the result.\n```"
        )
    return "```\n" + BASE_INSTRUCTION + "\n```"


def test_reflective_rewrites_the_instruction_and_raises_the_metric(tmp_path: Path) -> None:
    reflector_prompts: list[Prompt] = []

    def reflector(prompt: Prompt) -> str:
        reflector_prompts.append(prompt)
        return reflector_fn(prompt)

    store = open_store(tmp_path / "opt.db")
    result = optimize(
        make_agent(),
        TRAIN,
        VAL,
        exact,
        optimizer=Reflective(reflector=FunctionLLM(fn=reflector), minibatch=3),
        budget=30,
        store=store,
        seed=1,
    )
    assert result.baseline.mean() == 0.25
    assert result.best.mean() == 1.0
    node = optimisable_nodes(result.agent)["doubler.answer"]
    assert node.instruction == "Double the number and give only the result."  # type: ignore[attr-defined]
    # the reflection LLM read the failing runs of the node with the metric's feedback
    shown = reflector_prompts[0].messages[-1]["content"]
    assert (
        "Current instruction" in shown and BASE_INSTRUCTION in shown and "the answer must be twice" in shown
    )
    assert "Question: What is double" in shown
    assert result.rollouts_used <= 30
    # every tape is stored, and the winner's validation tapes carry its candidate tag
    store.flush()
    assert len(store.list_tapes(TapeFilter(tag=f"optimize:{result.run_id}"))) == result.rollouts_used
    assert len(store.list_tapes(TapeFilter(tag=candidate_tag(result.run_id, result.best.id)))) >= len(VAL)
    # ... and every tape carries the id of the configuration that made it (rejected proposals too)
    (run,) = result.runs
    ids = ["baseline", *(f"reflective-{i}" for i in range(1, run.proposals + 1))]
    tagged = [t for cid in ids for t in store.list_tapes(TapeFilter(tag=candidate_tag(result.run_id, cid)))]
    assert sorted(tagged) == sorted(store.list_tapes(TapeFilter(tag=f"optimize:{result.run_id}")))
    # deterministic: the same seed gives the same search
    again = optimize(
        make_agent(),
        TRAIN,
        VAL,
        exact,
        optimizer=Reflective(reflector=FunctionLLM(fn=reflector_fn)),
        budget=30,
        seed=1,
    )
    assert again.best.mean() == 1.0 and again.rollouts_used == result.rollouts_used
    assert "reflective" in result.to_text() and "0.250" in result.to_text() and "1.000" in result.to_text()


def test_add_demos_takes_demos_from_passed_training_tapes() -> None:
    result = optimize(make_agent(), TRAIN, VAL, exact, optimizer=AddDemos(max_demos=2), budget=20)
    demos = optimisable_nodes(result.agent)["doubler.answer"].demos  # type: ignore[attr-defined]
    assert len(demos) == 2
    for demo in demos:  # only passed tapes (even numbers) give demos
        n = int(demo.inputs["question"].split()[-1])
        assert n % 2 == 0 and demo.outputs["answer"] == str(2 * n)
    assert result.best.mean() == 1.0 and result.baseline.mean() == 0.25
    assert result.rollouts_used == len(VAL) + len(TRAIN) + len(VAL)


def test_budget_is_never_exceeded_and_bootstrap_is_seeded() -> None:
    for budget in (4, 9, 13, 17):
        result = optimize(
            make_agent(), TRAIN, VAL, exact, optimizer=BootstrapFewShot(n_candidates=8), budget=budget, seed=3
        )
        assert result.rollouts_used <= budget
        assert sum(r.rollouts for r in result.runs) + len(VAL) == result.rollouts_used
    a = optimize(make_agent(), TRAIN, VAL, exact, optimizer=BootstrapFewShot(), budget=40, seed=5)
    b = optimize(make_agent(), TRAIN, VAL, exact, optimizer=BootstrapFewShot(), budget=40, seed=5)
    assert [c.note for c in a.runs[0].candidates] == [c.note for c in b.runs[0].candidates]
    with pytest.raises(OptimizeError, match="budget"):
        optimize(make_agent(), TRAIN, VAL, exact, optimizer=AddDemos(), budget=3)


def test_instruction_search_uses_the_proposals() -> None:
    seen: list[str] = []

    def proposer(prompt: Prompt) -> str:
        seen.append(prompt.messages[-1]["content"])
        return "Instruction: Be brief.\nInstruction: Double the number in the question."

    opt = InstructionSearch(proposer=FunctionLLM(fn=proposer), use_demos=False, n_candidates=4)
    result = optimize(make_agent(), TRAIN, VAL, exact, optimizer=opt, budget=40, seed=0)
    assert "GOOD" in seen[0] and "BAD" in seen[0] and "the answer must be twice" in seen[0]
    node = optimisable_nodes(result.agent)["doubler.answer"]
    assert node.instruction == "Double the number in the question."  # type: ignore[attr-defined]
    assert result.best.mean() == 1.0


def two_node_agent() -> Agent:
    first = LLMFunctionNode(
        name="first",
        instruction="Answer the question.",
        inputs=[InputField(name="question", prefix="Question")],
        outputs=[OutputField.rationale("answer"), OutputField(name="answer", step="thought")],
        sources={"question": StepSource(kind="user")},
    )
    return Agent.create(
        "pair", llms=FunctionLLM(fn=stand_in), nodes=[first, make_agent().nodes[0].model_copy()]
    )


def test_targets_limit_what_changes_and_bad_targets_are_named() -> None:
    agent = two_node_agent()
    result = optimize(agent, TRAIN, VAL, exact, optimizer=AddDemos(), budget=20, targets=["pair.answer"])
    nodes = optimisable_nodes(result.agent)
    assert nodes["pair.first"].demos == []  # type: ignore[attr-defined]
    assert nodes["pair.answer"].demos  # type: ignore[attr-defined]
    with pytest.raises(OptimizeError, match=r"'pair\.nope'"):
        optimize(agent, TRAIN, VAL, exact, optimizer=AddDemos(), budget=20, targets=["pair.nope"])


def test_saved_config_reloads_and_resumes_from_every_cut(tmp_path: Path) -> None:
    result = optimize(make_agent(), TRAIN, VAL, exact, optimizer=AddDemos(max_demos=2), budget=20)
    path = result.save(tmp_path / "doubler.json")
    assert json.loads(path.read_text())["nodes"]["doubler.answer"]["demos"]
    loaded = load_optimized(make_agent(), path)
    assert loaded.nodes[0].model_dump() == result.agent.nodes[0].model_dump()
    env = ToolEnvironment()
    start = Tape(steps=StepSequence([UserStep(content="What is double 7? 7")]))
    full = main_loop(loaded, start, env).get_final_tape()
    assert full.steps[-1].content == "14"
    for cut in range(1, len(full)):
        resumed = main_loop(load_optimized(make_agent(), path), full[:cut], env).get_final_tape()
        assert [s.llm_dict() for s in resumed.steps] == [s.llm_dict() for s in full.steps], cut
    with pytest.raises(OptimizeError, match="saved for agent 'doubler'"):
        load_optimized(two_node_agent(), path)


def test_pareto_front_keeps_the_best_on_some_task_and_drops_the_dominated() -> None:
    from tapekit.evaluate import EvalReport, SampleResult
    from tapekit.optimize import Candidate

    def cand(cid: str, scores: dict[str, float]) -> Candidate:
        samples = [
            SampleResult(task_id=t, scores={"s": Score(value=v, passed=v == 1.0)}) for t, v in scores.items()
        ]
        return Candidate(
            id=cid, params={}, optimizer="x", val=EvalReport(name=cid, scorers=["s"], samples=samples)
        )

    a = cand("a", {"t1": 1.0, "t2": 0.0, "t3": 0.0})
    b = cand("b", {"t1": 0.0, "t2": 1.0, "t3": 1.0})
    c = cand("c", {"t1": 1.0, "t2": 0.0, "t3": 0.0})  # ties a: both stay
    d = cand("d", {"t1": 0.0, "t2": 1.0, "t3": 0.0})  # dominated by b
    front = dict((cand.id, wins) for cand, wins in pareto_front([a, b, c, d]))
    assert front == {"a": 1, "b": 2, "c": 1}


def mono_model(prompt: Prompt) -> str:
    """The same skill for a MonoNode: the question is the last user message before the
    instruction; demos are assistant messages before it."""
    messages = prompt.messages
    n = int(re.findall(r"-?\d+", messages[-2]["content"])[-1])
    guided = "twice" in messages[-1]["content"] or any(m["role"] == "assistant" for m in messages)
    return json.dumps(
        {"steps": [{"kind": "assistant", "content": str(2 * n if guided or n % 2 == 0 else n)}]}
    )


def test_mono_nodes_are_optimised_too() -> None:
    from tapekit import AssistantStep
    from tapekit.frameworks import MonoAgent, MonoNode

    def make() -> Agent:
        node = MonoNode(name="solve", instruction="Answer the last question.")
        return MonoAgent.create(
            "mono", llms=FunctionLLM(fn=mono_model), nodes=[node], step_classes=[AssistantStep]
        )

    demos = optimize(make(), TRAIN, VAL, exact, optimizer=AddDemos(max_demos=1), budget=20)
    assert demos.best.mean() == 1.0
    (demo,) = optimisable_nodes(demos.agent)["mono.solve"].demos  # type: ignore[attr-defined]
    assert set(demo.inputs) == {"user"} and '"kind": "assistant"' in demo.outputs["assistant"]

    def reflect(prompt: Prompt) -> str:
        ok = "the answer must be twice" in prompt.messages[-1]["content"]
        return "```\n" + ("Give twice the number." if ok else "Answer the last question.") + "\n```"

    reflected = optimize(
        make(), TRAIN, VAL, exact, optimizer=Reflective(reflector=FunctionLLM(fn=reflect)), budget=30
    )
    assert optimisable_nodes(reflected.agent)["mono.solve"].instruction == "Give twice the number."  # type: ignore[attr-defined]
    assert reflected.best.mean() == 1.0


@pytest.mark.parametrize("budget", [4, 7, 11, 16, 23])
def test_no_optimiser_goes_over_the_budget(budget: int) -> None:
    proposer = FunctionLLM(fn=lambda p: "Instruction: Double the number in the question.")
    optimizers = [
        AddDemos(),
        BootstrapFewShot(n_candidates=5),
        InstructionSearch(proposer=proposer),
        Reflective(reflector=FunctionLLM(fn=reflector_fn), minibatch=2),
    ]
    for opt in optimizers:
        result = optimize(make_agent(), TRAIN, VAL, exact, optimizer=opt, budget=budget)
        assert result.rollouts_used <= budget, opt.name
    both = optimize(make_agent(), TRAIN, VAL, exact, optimizer=optimizers, budget=budget)
    assert both.rollouts_used <= budget
    assert both.rollouts_used == len(VAL) + sum(r.rollouts for r in both.runs)


def test_a_teacher_bootstraps_the_demo_pool_and_its_rollouts_are_counted() -> None:
    # the teacher doubles every number (a stronger policy); left to itself the student's own
    # training tapes pass only on even numbers, the teacher's pass on all of them
    teacher_llm = FunctionLLM(
        fn=lambda p: f"Reasoning: double it\nAnswer: {2 * int(p.messages[-1]['content'].split()[-1])}"
    )
    teacher = make_agent(teacher_llm).model_copy(update={"name": "teacher"})
    result = optimize(
        make_agent(), TRAIN, VAL, exact, optimizer=AddDemos(max_demos=6, teacher=teacher), budget=20
    )
    demos = optimisable_nodes(result.agent)["doubler.answer"].demos  # type: ignore[attr-defined]
    numbers = sorted(int(d.inputs["question"].split()[-1]) for d in demos)
    assert numbers == [2, 3, 4, 5, 6, 8]  # odd numbers too: these came from the teacher's tapes
    assert all(d.outputs["answer"] == str(2 * int(d.inputs["question"].split()[-1])) for d in demos)
    assert result.rollouts_used == len(VAL) + len(TRAIN) + len(VAL)  # the teacher's runs count
    assert result.best.mean() == 1.0


def test_the_test_split_is_evaluated_once_after_the_choice_and_outside_the_budget() -> None:
    test = tasks([11, 12, 13, 14, 15], "test")
    calls: list[str] = []

    def counting(prompt: Prompt) -> str:
        calls.append(prompt.messages[-1]["content"])
        return stand_in(prompt)

    result = optimize(
        make_agent(FunctionLLM(fn=counting)),
        TRAIN,
        VAL,
        exact,
        optimizer=AddDemos(max_demos=2),
        budget=20,
        testset=test,
    )
    assert result.rollouts_used == len(VAL) + len(TRAIN) + len(VAL)  # the test runs are not in it
    assert len(calls) == result.rollouts_used + 2 * len(test)
    assert result.test_baseline is not None and result.test_best is not None
    assert result.test_baseline.mean_score().value == 0.4  # 12 and 14 only
    assert result.test_best.mean_score().value == 1.0
    diff = result.test_difference()
    assert diff.value == pytest.approx(0.6) and diff.excludes_zero
    assert "test before" in result.to_text() and "evaluated once" in result.to_text()
    with pytest.raises(OptimizeError, match="shares task ids"):
        optimize(make_agent(), TRAIN, VAL, exact, optimizer=AddDemos(), budget=20, testset=VAL[:1])
    plain = optimize(make_agent(), TRAIN, VAL, exact, optimizer=AddDemos(), budget=20)
    with pytest.raises(OptimizeError, match="no test split"):
        plain.test_difference()


def test_variant_search_scores_each_named_variant_on_validation() -> None:
    from tapekit.optimize import Variant, VariantSearch

    variants = [
        Variant(name="zero-shot"),
        Variant(name="told", instruction="Double the number."),
        Variant(name="pool", demos="pool"),
        Variant(name="two", demos=2),
    ]
    result = optimize(make_agent(), TRAIN, VAL, exact, optimizer=VariantSearch(variants=variants), budget=40)
    (run,) = result.runs
    assert [c.note for c in run.candidates] == ["zero-shot", "told", "pool", "two"]
    assert [c.mean() for c in run.candidates] == [0.25, 1.0, 1.0, 1.0]
    by_note = {c.note: c.params["doubler.answer"] for c in run.candidates}
    assert by_note["zero-shot"].demos == [] and by_note["told"].instruction == "Double the number."
    # the pool: the base agent's passed training tapes (even numbers only); two of them at random
    pool_numbers = sorted(int(d.inputs["question"].split()[-1]) for d in by_note["pool"].demos or [])
    assert pool_numbers == [2, 4, 6, 8]
    assert len(by_note["two"].demos or []) == 2
    assert result.rollouts_used == len(VAL) + len(TRAIN) + 4 * len(VAL)  # one training run for all
    assert result.baseline.seconds > 0 and all(c.seconds > 0 for c in run.candidates)  # their cost


def test_variant_options_set_node_fields_are_saved_and_bad_ones_named(tmp_path: Path) -> None:
    from tapekit import AssistantStep
    from tapekit.frameworks import DemoPick, MonoAgent, MonoNode
    from tapekit.optimize import Variant, VariantSearch

    shown: list[int] = []

    def counting(prompt: Prompt) -> str:
        shown.append(sum(m["role"] == "assistant" for m in prompt.messages))
        return mono_model(prompt)

    def make() -> Agent:
        node = MonoNode(name="solve", instruction="Answer the last question.")
        return MonoAgent.create(
            "mono", llms=FunctionLLM(fn=counting), nodes=[node], step_classes=[AssistantStep]
        )

    variant = Variant(name="nearest-1", demos="pool", options={"demo_pick": {"k": 1}})
    result = optimize(make(), TRAIN, VAL, exact, optimizer=VariantSearch(variants=[variant]), budget=20)
    node = optimisable_nodes(result.agent)["mono.solve"]
    assert node.demo_pick == DemoPick(k=1) and len(node.demos) == 4  # type: ignore[attr-defined]
    assert shown[-len(VAL) :] == [1] * len(VAL)  # a pool of four, one shown per prompt
    path = result.save(tmp_path / "opt.json")
    saved = json.loads(path.read_text())["nodes"]["mono.solve"]
    assert saved["options"] == {"demo_pick": {"k": 1, "rule": "nearest"}}
    reloaded = optimisable_nodes(load_optimized(make(), path))["mono.solve"]
    assert reloaded.demo_pick == DemoPick(k=1)  # type: ignore[attr-defined]

    with pytest.raises(OptimizeError, match=r"'mono.solve'.*no 'temprature' field"):
        optimize(
            make(),
            TRAIN,
            VAL,
            exact,
            optimizer=VariantSearch(variants=[Variant(name="typo", options={"temprature": 0.5})]),
            budget=20,
        )
    with pytest.raises(ValueError, match="must differ"):
        VariantSearch(variants=[Variant(name="a"), Variant(name="a", demos=1)])
    with pytest.raises(ValueError, match=">= 1"):
        Variant(name="none-at-all", demos=0)
