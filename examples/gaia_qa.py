"""A GAIA-style question-answering agent made of MonoNodes (the TapeAgents paper, section 4.2).

Two planning nodes (a plan, then the facts given and the facts to find) and an acting node
that loops: search the bundled documents, read one, compute with a calculator or with Python in
the sandbox, note new facts, and finally answer with a short exact answer. Every node shares
one prompt (the tape and the schemas of all the steps below) and differs by its instruction.

    python examples/gaia_qa.py                        # scripted stand-in model, offline
    python examples/gaia_qa.py --model http://127.0.0.1:8000/v1 --model-name NAME
"""

from __future__ import annotations

import ast
import json
import operator
import sys
from pathlib import Path
from typing import Any, Literal

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tapekit import (
    Action,
    ExternalObservationNeeded,
    FunctionLLM,
    MonoAgent,
    MonoNode,
    Observation,
    Prompt,
    Tape,
    Thought,
    ToolEnvironment,
    UserStep,
    main_loop,
)
from tapekit.sandbox import Sandbox

DOCS = Path(__file__).resolve().parent / "data" / "gaia"
SYSTEM = (
    "You answer hard questions. Find the facts in the documents, compute exactly, and give the "
    "shortest exact answer (a number, a name or a date)."
)


class Plan(Thought):
    """A numbered plan of how to answer the question."""

    kind: Literal["gaia_plan"] = "gaia_plan"
    steps: list[str]


class ListOfFacts(Thought):
    """The facts the question gives, and the facts that still have to be found."""

    kind: Literal["gaia_facts"] = "gaia_facts"
    given: list[str]
    to_find: list[str]


class NewFact(Thought):
    """A fact learnt from an observation, with where it comes from."""

    kind: Literal["gaia_new_fact"] = "gaia_new_fact"
    fact: str
    source: str


class SearchDocuments(Action):
    """Search the local documents; the result lists the matching files."""

    kind: Literal["gaia_search"] = "gaia_search"
    query: str


class ReadDocument(Action):
    """Read one document by its file name."""

    kind: Literal["gaia_read"] = "gaia_read"
    name: str


class UseCalculator(Action):
    """Evaluate an arithmetic expression (numbers, + - * / ** and parentheses)."""

    kind: Literal["gaia_calculate"] = "gaia_calculate"
    expression: str


class RunPython(Action):
    """Run a Python program in a sandbox without network; print the result."""

    kind: Literal["gaia_python"] = "gaia_python"
    code: str


class FinalAnswer(Action):
    """The final, shortest exact answer."""

    kind: Literal["gaia_answer"] = "gaia_answer"
    answer: str


class ActionResult(Observation):
    """What an action gave back."""

    kind: Literal["gaia_result"] = "gaia_result"
    action: str
    content: str


ACT_STEPS = [NewFact, SearchDocuments, ReadDocument, UseCalculator, RunPython, FinalAnswer]


def make_agent(llm: Any = None) -> MonoAgent:
    """The QA agent: plan, facts, then the acting loop."""
    return MonoAgent.create(
        "gaia",
        llms=llm or FunctionLLM(fn=scripted_model, model_name="scripted"),
        nodes=[
            MonoNode(name="plan", instruction="Write a plan to answer the question.", step_classes=[Plan]),
            MonoNode(
                name="facts",
                instruction="List the facts the question gives and the facts you must find.",
                step_classes=[ListOfFacts],
            ),
            MonoNode(
                name="act",
                instruction="Take the next step of the plan; when you know the answer, give it.",
                step_classes=ACT_STEPS,
                next_node="act",
                max_steps=2,
            ),
        ],
        system=SYSTEM,
        max_prompt_tokens=3000,
    )


# ----------------------------------------------------------------------------- the tools


def search(query: str) -> str:
    """The documents sharing words with the query, best first."""
    words = {w.strip("?.,").lower() for w in query.split() if len(w) > 3}
    scores = []
    for path in sorted(DOCS.glob("*.txt")):
        text = path.read_text().lower()
        score = sum(text.count(w) for w in words)
        if score:
            scores.append((-score, path.name))
    return json.dumps([name for _, name in sorted(scores)][:3])


def read(name: str) -> str:
    """A bundled document's text (only the bundled ones can be read)."""
    path = DOCS / Path(name).name
    if path.suffix != ".txt" or not path.exists():
        return f"no document named {name!r}"
    return path.read_text()


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_OPS[ast.Pow] = operator.pow


def calculate(expression: str) -> str:
    """Arithmetic only: numbers and + - * / ** with parentheses."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(result) if float(result).is_integer() else result)


def make_environment(sandbox: Sandbox | None = None) -> ToolEnvironment:
    """The tools as handlers of the action steps (Python only with a sandbox)."""

    async def python(action: RunPython) -> ActionResult:
        if sandbox is None:
            return ActionResult(action="python", content="error: no sandbox here")
        result = await sandbox.arun_python(action.code)
        return ActionResult(action="python", content=result.to_observation())

    def answer(action: FinalAnswer) -> Observation:
        raise ExternalObservationNeeded(action)

    return ToolEnvironment(
        handlers={
            SearchDocuments: lambda a: ActionResult(action="search", content=search(a.query)),
            ReadDocument: lambda a: ActionResult(action="read", content=read(a.name)),
            UseCalculator: lambda a: ActionResult(action="calculate", content=calculate(a.expression)),
            RunPython: python,
            FinalAnswer: answer,
        }
    )


# ----------------------------------------------------------------------------- the stand-in model


def scripted_model(prompt: Prompt) -> str:
    """Plays the model for the bundled question: plan, facts, search, read, note, compute, answer."""
    instruction = prompt.messages[-1]["content"]

    def steps(*items: dict[str, Any]) -> str:
        return json.dumps({"steps": list(items)})

    if instruction.startswith("Write a plan"):
        plan = ["find the founding year", "find the first launch year", "compute the difference times 3"]
        return steps({"kind": "gaia_plan", "steps": plan})
    if instruction.startswith("List the facts"):
        return steps(
            {"kind": "gaia_facts", "given": ["multiply by 3"], "to_find": ["founding year", "launch year"]}
        )
    results = [json.loads(m["content"]) for m in prompt.messages if '"gaia_result"' in m["content"]]
    last = results[-1] if results else None
    if last is None:
        return steps({"kind": "gaia_search", "query": "Lumen Observatory founded satellite launched"})
    if last["action"] == "search":
        return steps({"kind": "gaia_read", "name": json.loads(last["content"])[0]})
    if last["action"] == "read":
        fact = {
            "kind": "gaia_new_fact",
            "fact": "founded 1962, first satellite 1987",
            "source": "lumen_observatory.txt",
        }
        return steps(fact, {"kind": "gaia_calculate", "expression": "(1987 - 1962) * 3"})
    return steps({"kind": "gaia_answer", "answer": last["content"]})


def run(agent: MonoAgent, question: str, sandbox: Sandbox | None = None) -> Tape[Any, Any]:
    """Answer ``question`` (the session stops at the final answer)."""
    start: Tape[Any, Any] = Tape(steps=[UserStep(content=question)])
    return main_loop(agent, start, make_environment(sandbox)).get_final_tape()


def main(argv: list[str] | None = None) -> int:
    """Answer the bundled questions (or one given) and print each tape."""
    import argparse

    parser = argparse.ArgumentParser(description="A GAIA-style QA agent made of MonoNodes.")
    parser.add_argument("question", nargs="*", help="a question (default: the bundled tasks)")
    parser.add_argument("--model", default="scripted", help="scripted (default) or an OpenAI-compatible URL")
    parser.add_argument("--model-name", default="default", help="the model name to send to a URL endpoint")
    args = parser.parse_args(argv)
    llm = None
    if args.model != "scripted":
        from tapekit.llm import OpenAICompatibleLLM

        llm = OpenAICompatibleLLM(model_name=args.model_name, base_url=args.model)
    tasks = json.loads((DOCS / "tasks.json").read_text())
    if args.question:
        tasks = [{"id": "asked", "question": " ".join(args.question), "expected": None}]
    sandbox = Sandbox() if Sandbox.available() is None else None
    right = 0
    try:
        for task in tasks:
            tape = run(make_agent(llm), task["question"], sandbox)
            for i, step in enumerate(tape.steps):
                body = json.dumps({k: v for k, v in step.llm_dict().items() if k != "kind"})
                print(f"[{i:2}] {step.metadata.node or 'environment':12} {step.kind:14} {body[:80]}")
            got = getattr(tape.steps[-1], "answer", None)
            right += got == task["expected"]
            print(
                f"{task['id']}: answer {got!r}, expected {task['expected']!r}"
                + (f" ({tape.metadata.error})" if tape.metadata.error else "")
            )
    finally:
        if sandbox is not None:
            sandbox.close()
    print(f"{right}/{len(tasks)} right")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
