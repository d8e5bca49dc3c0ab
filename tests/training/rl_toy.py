"""A small RL setup for the RL tests, built on tapekit's public API alone (no ``examples``).

- 12 arithmetic word problems (:data:`PROBLEMS`), made by formula (no randomness): problem
  ``i`` applies ``i % 3 + 1`` operations (+, - or x2/x3) to a starting quantity; its category
  (``one-op``, ``two-ops``, ``three-ops``) is the curriculum's arm.
- A one-node agent that writes plain text, one turn per calculator call (a multi-turn tool
  user whose text a tiny model can write and whose steps render back to that text exactly,
  so its tapes replay and resume)::

      calculator: 12+7
      ... [tool result] 19 ...
      calculator: 19*3
      ... [tool result] 57 ...
      Answer: 57

- A calculator environment (one tool, ``calculator(expression)``, for ``a op b``).
- Scorers: ``strict`` (``Answer: <expected>`` exactly), ``lenient`` (the expected number
  written anywhere), ``steps`` (the calculator calls that follow the problem's operations, in
  order, plus the strict answer) and ``digits``, the reward: the share of digits in what the
  agent wrote, dense, so that even a random tiny model's groups differ and every step has signal.
- A tiny random model whose tokenizer knows the problems' words (:func:`make_model`).

``tapekit train rl`` configs load the setup as ``tests.training.rl_toy:make_setup``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tapekit import (
    Agent,
    AssistantThought,
    FunctionLLM,
    LLMOutput,
    LLMStream,
    Node,
    Prompt,
    SetNextNode,
    Step,
    StopStep,
    Tape,
    Thought,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    UserStep,
)
from tapekit.evaluate import Score, Task

__all__ = [
    "CATEGORIES",
    "PROBLEMS",
    "SYSTEM",
    "ToyAnswer",
    "ToyProblem",
    "ToySolveNode",
    "calculator",
    "digit_share",
    "make_agent",
    "make_model",
    "make_problems",
    "make_setup",
    "oracle_llm",
    "rollout_results",
]

SYSTEM = "Solve with the calculator: 'calculator: a+b', one step a turn, then 'Answer: n'."
# by the number of operations; no "step" in a name: the CLI prints each arm as name=p on its
# step lines, and a test counts the "step=" in its output
CATEGORIES = ("one-op", "two-ops", "three-ops")
NAMES = (("Ann", "She"), ("Ben", "He"), ("Cleo", "She"), ("Dan", "He"))
ITEMS = ("apples", "coins", "pens", "cards", "shells")

_CALL = re.compile(r"^calculator: (.+)$")
_ANSWER = re.compile(r"^Answer: (-?\d+)$")
_BINARY = re.compile(r"^\s*(-?\d+)\s*([-+*/])\s*(-?\d+)\s*$")


# ----------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class ToyProblem:
    """A word problem: ``start``, then ``operations`` (``(op, operand)``, applied left to right)."""

    id: str
    category: str
    question: str
    start: int
    operations: tuple[tuple[str, int], ...]

    def steps(self) -> list[tuple[int, str, int, int]]:
        """The calculator steps ``(left, op, right, result)``, each on the previous result."""
        out, value = [], self.start
        for op, operand in self.operations:
            result = _apply(value, op, operand)
            out.append((value, op, operand, result))
            value = result
        return out

    @property
    def answer(self) -> int:
        """The quantity after the last operation."""
        steps = self.steps()
        return steps[-1][3] if steps else self.start


def _apply(left: int, op: str, right: int) -> int:
    """``left op right`` on integers (``/`` only when exact)."""
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/" and right and left % right == 0:
        return left // right
    raise ValueError(f"cannot compute {left}{op}{right} exactly")


def _problem(i: int) -> ToyProblem:
    """Problem ``i``, by formula: the same every time."""
    name, pronoun = NAMES[i % len(NAMES)]
    item = ITEMS[i % len(ITEMS)]
    start = 5 + (7 * i) % 23
    value, operations, sentences = start, [], [f"{name} has {start} {item}."]
    for k in range(i % 3 + 1):
        op = "+-*"[(i + k) % 3]
        if op == "+":
            operand = 2 + (3 * i + 5 * k) % 15
            sentences.append(f"{pronoun} gets {operand} more.")
        elif op == "-":
            operand = value // 2  # value >= 5 here, so something is left
            sentences.append(f"{pronoun} gives away {operand}.")
        else:
            operand = 2 + (i + k) % 2
            sentences.append(f"The number of {item} {'doubles' if operand == 2 else 'triples'}.")
        operations.append((op, operand))
        value = _apply(value, op, operand)
    sentences.append(f"How many {item} does {name} have now?")
    return ToyProblem(f"toy-{i}", CATEGORIES[i % 3], " ".join(sentences), start, tuple(operations))


def make_problems(n: int = 12) -> list[ToyProblem]:
    """The first ``n`` toy problems, the three categories in turn."""
    return [_problem(i) for i in range(n)]


PROBLEMS = make_problems()


# ----------------------------------------------------------------------------- the tool and the agent


def calculator(expression: str) -> int:
    """Compute one operation on two integers.

    Args:
        expression: "a op b" with op one of + - * /, e.g. "12+7".
    """
    match = _BINARY.match(expression)
    if match is None:
        raise ValueError(f"write one operation on two integers, e.g. 12+7; got {expression[:40]!r}")
    return _apply(int(match[1]), match[2], int(match[3]))


class ToyAnswer(Thought):
    """The agent's final line, as written (``Answer: <integer>`` when well formed)."""

    kind: Literal["rl_toy_answer"] = "rl_toy_answer"
    text: str


def parse_output(text: str, first_call: int) -> list[Step]:
    """One turn's text as steps: trailing ``calculator:`` lines are tool calls (``calc_<first_call>``,
    ...); without them the last line is the final answer (:class:`ToyAnswer` and a ``StopStep``);
    anything before is an ``AssistantThought``. Exactly inverted by :func:`render_output`."""
    lines = text.split("\n")
    n_calls = 0
    while n_calls < len(lines) and _CALL.match(lines[len(lines) - 1 - n_calls]):
        n_calls += 1
    body, tail = lines[: len(lines) - n_calls], lines[len(lines) - n_calls :]
    final = None if n_calls else body.pop()
    steps: list[Step] = [AssistantThought(content="\n".join(body))] if body else []
    for k, line in enumerate(tail):
        match = _CALL.match(line)
        assert match is not None
        steps.append(
            ToolCall(name="calculator", arguments={"expression": match[1]}, call_id=f"calc_{first_call + k}")
        )
    if final is not None:
        steps += [ToyAnswer(text=final), StopStep(reason="answered")]
    return steps


def render_output(steps: list[Step]) -> str:
    """The text of one turn's steps (routing steps ignored)."""
    lines: list[str] = []
    for step in steps:
        if isinstance(step, AssistantThought):
            lines.append(step.content)
        elif isinstance(step, ToolCall):
            lines.append(f"calculator: {step.arguments.get('expression', '')}")
        elif isinstance(step, ToyAnswer):
            lines.append(step.text)
    return "\n".join(lines)


def _turn(tape: Tape[Any, Any], index: int) -> list[Step]:
    """The agent's steps from ``index`` up to the next observation (routing left out)."""
    out: list[Step] = []
    for step in tape.steps[index:]:
        if not step.metadata.agent:
            break
        if not isinstance(step, SetNextNode):
            out.append(step)
    return out


def _messages(tape: Tape[Any, Any]) -> list[dict[str, Any]]:
    """The chat: :data:`SYSTEM`, the question, the agent's turns as it wrote them, the tool results."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    steps = list(tape.steps)
    i = 0
    while i < len(steps):
        step = steps[i]
        if isinstance(step, UserStep):
            messages.append({"role": "user", "content": step.content})
        elif isinstance(step, ToolResult):
            content = f"Error: {step.error}" if step.error else str(step.content)
            messages.append({"role": "tool", "tool_call_id": step.call_id, "content": content})
        elif step.metadata.agent:
            turn = _turn(tape, i)
            while i + 1 < len(steps) and steps[i + 1].metadata.agent:
                i += 1
            if turn:
                messages.append({"role": "assistant", "content": render_output(turn)})
        i += 1
    return messages


class ToySolveNode(Node):
    """The agent's only node: calculator calls, one turn each, then the answer."""

    name: str = "solve"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        """The whole conversation so far, in the agent's own text."""
        return Prompt(messages=_messages(tape))

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The parsed text; back to this node after tool calls."""
        calls = sum(isinstance(s, ToolCall) for s in tape.steps)
        steps = parse_output(llm_stream.get_text(), calls + 1)
        if any(isinstance(s, ToolCall) for s in steps):
            yield SetNextNode(next_node=self.name)
        yield from steps

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The text that makes the agent's steps from ``index`` to the next observation."""
        return LLMOutput(content=render_output(_turn(tape, index)))


def make_agent(llm: Any) -> Agent:
    """The toy agent on ``llm``."""
    return Agent.create("toy", llms=llm, nodes=[ToySolveNode()])


# ----------------------------------------------------------------------------- scorers


def _written(tape: Tape[Any, Any]) -> str:
    """Everything the agent wrote, as it wrote it."""
    return render_output([s for s in tape.steps if s.metadata.agent])


def strict(tape: Tape[Any, Any], task: Task) -> Score:
    """Pass when the last answer line is ``Answer: <expected>`` exactly."""
    answer = next((s for s in reversed(tape.steps) if isinstance(s, ToyAnswer)), None)
    if answer is None:
        return Score(value=0.0, passed=False, feedback="no final answer")
    match = _ANSWER.match(answer.text)
    passed = match is not None and int(match[1]) == task.expected
    return Score(value=float(passed), passed=passed, feedback=None if passed else f"answered {answer.text!r}")


def lenient(tape: Tape[Any, Any], task: Task) -> Score:
    """Pass when the expected number appears (as a whole number) anywhere in the agent's writing."""
    found = re.search(rf"(?<![\d.]){task.expected}(?![\d.])", _written(tape)) is not None
    return Score(value=float(found), passed=found)


def step_credit(tape: Tape[Any, Any], task: Task) -> Score:
    """The share of the problem's operations that the calculator calls carry out right, in
    order (counting stops at the first wrong call), with the strict answer as one more part."""
    problem = _BY_ID[task.id]
    expected = [f"{left}{op}{right}" for left, op, right, _ in problem.steps()]
    calls = [
        str(s.arguments.get("expression", "")).replace(" ", "") for s in tape.steps if isinstance(s, ToolCall)
    ]
    right = 0
    for call, want in zip(calls, expected, strict=False):
        if call != want:
            break
        right += 1
    passed = strict(tape, task).passed
    return Score(value=(right + float(passed)) / (len(expected) + 1), passed=passed)


def digit_share(tape: Tape[Any, Any], task: Task) -> float:
    """The share of digits in the agent's writing (0.0 when it wrote nothing): the dense reward."""
    text = _written(tape)
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


_BY_ID = {p.id: p for p in PROBLEMS}


# ----------------------------------------------------------------------------- the setup and the model


def make_setup(reward: str = "digits") -> Any:
    """The :class:`~tapekit.training.RLSetup` of the tests: the toy agent on :data:`PROBLEMS`
    (categories as the curriculum's arms), every scorer reported, ``reward`` trained on
    (``tapekit train rl`` loads it as ``tests.training.rl_toy:make_setup``)."""
    from tapekit.training.rl import RLSetup

    # a task with a question starts from a tape of one UserStep holding it
    tasks = [Task(id=p.id, question=p.question, category=p.category, expected=p.answer) for p in PROBLEMS]
    return RLSetup(
        agent_for=make_agent,
        environment=ToolEnvironment([calculator]),
        tasks=tasks,
        scorers={"strict": strict, "lenient": lenient, "steps": step_credit, "digits": digit_share},
        reward=reward,
    )


def oracle_llm() -> FunctionLLM:
    """An LLM that solves every problem of :data:`PROBLEMS`: the problem's calculator calls one
    turn at a time (each on the last result), then ``Answer: n``."""
    by_question = {p.question: p for p in PROBLEMS}

    def oracle(prompt: Prompt) -> str:
        problem = by_question[next(m["content"] for m in prompt.messages if m["role"] == "user")]
        results = [int(m["content"]) for m in prompt.messages if m["role"] == "tool"]
        if len(results) == len(problem.operations):
            return f"Answer: {results[-1]}"
        op, operand = problem.operations[len(results)]
        return f"calculator: {results[-1] if results else problem.start}{op}{operand}"

    return FunctionLLM(fn=oracle)


def make_model(path: Path | None = None) -> tuple[Any, Any]:
    """A tiny random model whose tokenizer knows the problems' words (saved to ``path``)."""
    from tapekit.testing.tiny import TinyConfig, make_tiny

    texts = ["system", "user", "assistant", "tool", SYSTEM, *(p.question for p in PROBLEMS)]
    texts += ["calculator: 12+7", "19", "calculator: 19*3", "Answer: 57"]
    config = TinyConfig(
        vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0
    )
    return make_tiny(texts, config, path)  # type: ignore[no-any-return]


def rollout_results(db: Path, run: str, steps: int) -> list[list[tuple[str, float]]]:
    """(task id, reward) of every rollout tape an RL run named ``run`` stored in the store
    ``db`` at each of its first ``steps`` steps (tags ``rl:<run>:step:<n>``). The steps of the
    tapes' kind must be imported (for web tapes, ``tapekit.web``) before the call."""
    from tapekit.store import TapeFilter, open_store

    store = open_store(str(db))
    try:
        out = []
        for step in range(steps):
            ids = store.list_tapes(where=TapeFilter(tag=f"rl:{run}:step:{step}"))
            tapes = [store.get_tape(i) for i in ids]
            out.append([(t.metadata.result["task_id"], t.metadata.result["reward"]) for t in tapes])
        return out
    finally:
        store.close()
