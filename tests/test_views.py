"""The tape view stack: push/pop semantics, node pointers, and the incremental memoised fold."""

from __future__ import annotations

from typing import Any, Literal

from tapekit import Call, Observation, Respond, SetNextNode, Step, Tape, TapeViewStack, Thought, cached_fold
from tapekit.views import TapeView


class Msg(Observation):
    kind: Literal["viewtest_msg"] = "viewtest_msg"
    text: str = ""


class Idea(Thought):
    kind: Literal["viewtest_idea"] = "viewtest_idea"
    text: str = ""


def by(step: Step, agent: str, node: str, pid: str, end: bool = True) -> Step:
    step.metadata.agent, step.metadata.node, step.metadata.prompt_id, step.metadata.run_end = (
        agent,
        node,
        pid,
        end,
    )
    return step


def test_initial_stack_has_only_the_root_view() -> None:
    stack = TapeViewStack.compute(Tape(), "root")
    assert len(stack) == 1 and stack.top is stack.bottom
    assert stack.top == TapeView(agent_name="root")
    assert stack.top.call is None and stack.top.last_node is None and stack.top.next_node is None


def test_node_pointer_follows_runs_and_set_next_node() -> None:
    steps = [
        Msg(text="hi"),
        by(Idea(text="a"), "root", "think", "p1", end=False),
        by(SetNextNode(next_node="think"), "root", "think", "p1"),
    ]
    top = TapeViewStack.compute(Tape(steps=steps[:2]), "root").top
    assert top.last_node == "think" and top.run_open and top.run_start == 1 and top.next_node is None
    top = TapeViewStack.compute(Tape(steps=steps), "root").top
    assert top.next_node == "think" and not top.run_open
    # a new node run clears the SetNextNode target
    steps.append(by(Idea(text="b"), "root", "act", "p2"))
    top = TapeViewStack.compute(Tape(steps=steps), "root").top
    assert top.last_node == "act" and top.next_node is None and top.last_prompt_id == "p2"
    # observations and steps of other authors do not move the pointer
    steps.append(Msg(text="obs"))
    top = TapeViewStack.compute(Tape(steps=steps), "root").top
    assert top.last_node == "act" and len(top.steps) == 5


def test_call_pushes_and_respond_pops() -> None:
    steps: list[Step] = [
        Msg(text="task"),
        by(Call(agent_name="helper", content="do it"), "root", "delegate", "p1"),
        by(Idea(text="inner"), "root/helper", "work", "p2"),
        by(Call(agent_name="deep", content="deeper"), "root/helper", "work2", "p3"),
        by(Idea(text="deepest"), "root/helper/deep", "n", "p4"),
        by(Respond(content="d"), "root/helper/deep", "n2", "p5"),
        by(Respond(content="h"), "root/helper", "work3", "p6"),
    ]
    names = [
        [v.agent_name for v in TapeViewStack.compute(Tape(steps=steps[:k]), "root").views]
        for k in range(1, len(steps) + 1)
    ]
    assert names == [
        ["root"],
        ["root", "root/helper"],
        ["root", "root/helper"],
        ["root", "root/helper", "root/helper/deep"],
        ["root", "root/helper", "root/helper/deep"],
        ["root", "root/helper"],
        ["root"],
    ]
    final = TapeViewStack.compute(Tape(steps=steps), "root")
    # the caller sees its call and the response, not the helper's inner steps
    assert [s.kind for s in final.top.steps] == ["viewtest_msg", "call", "respond"]
    middle = TapeViewStack.compute(Tape(steps=steps[:6]), "root").top
    assert [s.kind for s in middle.steps] == ["call", "viewtest_idea", "call", "respond"]
    assert middle.call is not None and middle.call.content == "do it"
    assert middle.last_node == "work2"  # the deep agent's runs do not move the helper's pointer


def test_respond_from_the_root_keeps_the_root_view() -> None:
    steps = [Msg(text="x"), by(Respond(content="bye"), "root", "n", "p1")]
    stack = TapeViewStack.compute(Tape(steps=steps), "root")
    assert len(stack) == 1 and isinstance(stack.top.steps[-1], Respond)


def test_the_fold_is_incremental(monkeypatch: Any) -> None:
    pushes = 0
    original = TapeViewStack.push

    def counting(self: TapeViewStack, step: Step, index: int = -1) -> TapeViewStack:
        nonlocal pushes
        pushes += 1
        return original(self, step, index)

    monkeypatch.setattr(TapeViewStack, "push", counting)
    tape: Tape[Any, Any] = Tape(steps=[Msg(text=str(i)) for i in range(5000)])
    TapeViewStack.compute(tape, "root")
    assert pushes == 5000
    for i in range(100):  # a running session: one step, one view computation, one fold step
        tape = tape.append(Msg(text=f"new {i}"))
        TapeViewStack.compute(tape, "root")
    assert pushes == 5100
    TapeViewStack.compute(tape[:2500], "root")  # an older prefix resumes from the nearest memo
    assert pushes <= 5100 + 2500
    before = pushes
    TapeViewStack.compute(tape, "other-root")  # a different team folds on its own
    assert pushes == before + len(tape)


def test_cached_fold_for_user_state() -> None:
    def count_ideas(state: int, step: Step, index: int) -> int:
        return state + isinstance(step, Idea)

    tape: Tape[Any, Any] = Tape(steps=[Idea(), Msg(), Idea()])
    assert cached_fold(tape, "ideas", lambda: 0, count_ideas) == 2
    longer = tape.append(Idea())
    assert cached_fold(longer, "ideas", lambda: 0, count_ideas) == 3
    assert cached_fold(tape, "ideas", lambda: 0, count_ideas) == 2  # the shorter tape is unchanged


def test_folds_from_many_threads_over_one_buffer_agree_with_a_fresh_fold() -> None:
    import random
    import sys
    import threading

    tape = Tape(steps=[Msg(text=str(i)) for i in range(3000)])

    def count(t: Tape[Any, Any]) -> int:
        return cached_fold(t, "viewtest_threads", lambda: 0, lambda n, step, index: n + 1)

    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            n = rng.randrange(len(tape) + 1)
            got = count(tape[:n])
            if got != n:
                errors.append(f"prefix {n} folded to {got}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
