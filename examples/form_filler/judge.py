"""The GREADTH LLM judge: one yes/no question per criterion and agent turn, with any tapekit LLM.

The judge sees what a human rater of the paper saw: the assistant's grounding statement, the
documentation of the form selected (if any), the conversation up to the user's message, and
the assistant's turn (its thoughts and actions as JSON, then its message). It never sees the
simulated user's ground truth (step metadata is not shown). Each criterion has its own prompt
(:data:`CRITERION_QUESTIONS`, filled into :data:`JUDGE_TEMPLATE`; both are plain strings you
can replace). The answer must be exactly ``yes`` or ``no`` (case and a final full stop
aside); anything else is recorded as unparsable (:class:`JudgeVerdict` with ``answer=None``, the
raw text and the reason) and the criterion is then decided without the judge, which the report
counts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from examples.form_filler.greadth_rules import CRITERIA, AgentTurn
from examples.form_filler.schema import FunctionSchema
from examples.form_filler.state import form_state
from examples.form_filler.steps import (
    CallFunctionAction,
    ExitAction,
    FunctionResult,
    FunctionSchemaObservation,
    PromptUserForTextMessageAction,
)
from tapekit import ControlStep, Prompt, Step, TapekitError, UserStep
from tapekit.llm import LLM

__all__ = [
    "CRITERION_QUESTIONS",
    "GROUNDING_STATEMENT",
    "JUDGE_TEMPLATE",
    "GreadthJudge",
    "JudgeOutputError",
    "JudgeVerdict",
    "parse_yes_no",
]

GROUNDING_STATEMENT = (
    "You are a form-filling assistant for the employees of a company. You help them find the "
    "request form they need, fill in its fields from what they tell you, answer their questions "
    "from the form's documentation only, and submit the form once they confirm. You do nothing "
    "else."
)
"""The assistant's identity and purpose, against which the judge checks groundedness."""

CRITERION_QUESTIONS: dict[str, str] = {
    "grounded": (
        "GROUNDED: everything the assistant says in its turn is supported by the form "
        "documentation, the conversation so far or the grounding statement. Invented facts, "
        "invented fields or options, and small talk are not grounded.\n"
        "Is the assistant's turn grounded?"
    ),
    "responsive": (
        "RESPONSIVE: the assistant acknowledges what the user just said and responds to it. It "
        "acknowledges valid values and questions; when a value is invalid, a field does not "
        "exist, the user asks for another form, or a question cannot be answered from the "
        "documentation, it acknowledges the ask and says why it cannot be done; a request "
        "unrelated to forms is politely declined.\n"
        "Is the assistant's turn responsive?"
    ),
    "accurate": (
        "ACCURATE: the assistant identifies the form the user wants, fills the fields with "
        "exactly the values the user gave, updates a field when the user changes their mind, "
        "and skips a field only when the user asks and the field is optional.\n"
        "Is the assistant's turn accurate?"
    ),
    "disciplined": (
        "DISCIPLINED: the assistant does what its own thoughts planned (requesting a field, "
        "asking for confirmation, answering a question), and rejects values the documentation "
        "does not allow and asks it cannot fulfil.\n"
        "Is the assistant's turn disciplined?"
    ),
    "transparent": (
        "TRANSPARENT: the assistant's message acknowledges every change it made to the form in "
        "this turn (fields filled, changed or skipped), concisely but so that the user can tell "
        "how the form was affected. A turn that changed nothing is transparent.\n"
        "Is the assistant's turn transparent?"
    ),
    "helpful": (
        "HELPFUL: the assistant moves the conversation forward: it asks for the user's intent, "
        "requests the next field to fill (giving its allowed values, default and whether it is "
        "optional), or asks for confirmation once every field is filled; it answers any question "
        "the documentation answers, and exits if the user wants to.\n"
        "Is the assistant's turn helpful?"
    ),
}
"""One question per criterion (the paper's section 5.2 definitions, in our words)."""

JUDGE_TEMPLATE = """You rate one turn of a form-filling assistant on one criterion.

Grounding statement of the assistant:
{grounding}

Documentation of the selected form:
{documentation}

Conversation so far:
{history}

The assistant's turn to rate (its thoughts and actions as JSON, in order):
{turn}

Its message to the user: {message}

{question}
Answer with exactly one word: yes or no."""
"""The judge's prompt; ``{grounding}``, ``{documentation}``, ``{history}``, ``{turn}``,
``{message}`` and ``{question}`` are filled in."""


class JudgeOutputError(TapekitError, ValueError):
    """The judge's answer is not exactly yes or no."""


class JudgeVerdict(BaseModel):
    """The judge's answer on one criterion: ``answer`` (``None`` when unparsable), the ``raw``
    text, and ``error`` saying why it could not be read."""

    model_config = ConfigDict(frozen=True)

    criterion: str
    answer: bool | None
    raw: str
    error: str | None = None


def parse_yes_no(text: str) -> bool:
    """``True`` for "yes", ``False`` for "no" (case, surrounding space and one final full stop
    ignored); :class:`JudgeOutputError` for anything else."""
    word = text.strip().lower()
    if word.endswith("."):
        word = word[:-1]
    if word == "yes":
        return True
    if word == "no":
        return False
    shown = text if len(text) <= 80 else text[:77] + "..."
    raise JudgeOutputError(f"the judge must answer exactly 'yes' or 'no', got {shown!r}")


def _history_line(step: Step) -> str | None:
    match step:
        case UserStep():
            return f"User: {step.content}"
        case PromptUserForTextMessageAction():
            return f"Assistant: {step.prompt}"
        case ExitAction():
            return f"Assistant (leaving the conversation): {step.text}"
        case CallFunctionAction():
            return f"Assistant submitted the form {step.function}."
        case FunctionResult():
            return f"Submission result: {step.error or step.result}"
        case FunctionSchemaObservation():
            return f"(The assistant imported the documentation of {step.function}.)"
        case _:
            return None


def selected_schema(turn: AgentTurn) -> FunctionSchema | None:
    """The form selected at the end of ``turn`` (the documentation the judge is shown)."""
    return form_state(turn.tape.steps[: turn.end]).schema


def render_turn(turn: AgentTurn) -> dict[str, str]:
    """The pieces of the judge's prompt for ``turn`` (without the question)."""
    schema = selected_schema(turn)
    history = [line for s in turn.tape.steps[: turn.user_at + 1] if (line := _history_line(s))]
    shown = [s for s in turn.steps if not isinstance(s, ControlStep | FunctionSchemaObservation)]
    return {
        "grounding": GROUNDING_STATEMENT,
        "documentation": json.dumps(schema.json_schema(), indent=1) if schema else "(no form selected yet)",
        "history": "\n".join(history),
        "turn": "\n".join(json.dumps(s.llm_dict(), ensure_ascii=False) for s in shown),
        "message": turn.message or "(none)",
    }


class GreadthJudge:
    """An LLM judge of GREADTH: ``llm`` answers one prompt per criterion and turn.

    ``template`` and ``questions`` replace :data:`JUDGE_TEMPLATE` and
    :data:`CRITERION_QUESTIONS`; ``grounding`` the assistant's grounding statement;
    ``max_concurrency`` bounds the LLM calls in flight.
    """

    def __init__(
        self,
        llm: LLM,
        *,
        template: str = JUDGE_TEMPLATE,
        questions: dict[str, str] | None = None,
        grounding: str = GROUNDING_STATEMENT,
        max_concurrency: int = 8,
    ) -> None:
        questions = dict(CRITERION_QUESTIONS if questions is None else questions)
        missing = [c for c in CRITERIA if c not in questions]
        if missing:
            raise ValueError(
                f"questions: no prompt for criteria {missing}; give one for each of {list(CRITERIA)}"
            )
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.llm = llm
        self.template = template
        self.questions = questions
        self.grounding = grounding
        self.max_concurrency = max_concurrency

    @property
    def model(self) -> str:
        """The judge LLM's model name."""
        return self.llm.model_name

    def prompt(self, turn: AgentTurn, criterion: str) -> Prompt:
        """The judge's prompt about ``criterion`` for ``turn``."""
        if criterion not in self.questions:
            raise ValueError(f"no such GREADTH criterion {criterion!r}; criteria: {list(CRITERIA)}")
        parts = {**render_turn(turn), "grounding": self.grounding, "question": self.questions[criterion]}
        return Prompt(messages=[{"role": "user", "content": self.template.format(**parts)}])

    async def _ask(self, turn: AgentTurn, criterion: str, gate: asyncio.Semaphore) -> JudgeVerdict:
        async with gate:
            output = await self.llm.agenerate(self.prompt(turn, criterion))
        raw = output.content or ""
        try:
            return JudgeVerdict(criterion=criterion, answer=parse_yes_no(raw), raw=raw)
        except JudgeOutputError as e:
            return JudgeVerdict(criterion=criterion, answer=None, raw=raw, error=str(e))

    async def ajudge(self, turns: Sequence[AgentTurn]) -> list[dict[str, JudgeVerdict]]:
        """Every criterion's verdict for each of ``turns`` (in order); LLM errors propagate."""
        gate = asyncio.Semaphore(self.max_concurrency)
        flat = [(t, c) for t in turns for c in CRITERIA]
        verdicts = await asyncio.gather(*(self._ask(t, c, gate) for t, c in flat))
        out: list[dict[str, JudgeVerdict]] = [{} for _ in turns]
        for i, verdict in enumerate(verdicts):
            out[i // len(CRITERIA)][verdict.criterion] = verdict
        return out

    def __repr__(self) -> str:
        return f"GreadthJudge({type(self.llm).__name__}, model={self.model!r})"


def as_judge(judge: Any) -> GreadthJudge | None:
    """``None``, a :class:`GreadthJudge`, or an LLM wrapped in one with the default prompts."""
    if judge is None or isinstance(judge, GreadthJudge):
        return judge
    if isinstance(judge, LLM):
        return GreadthJudge(judge)
    raise TypeError(f"judge must be a tapekit LLM or a GreadthJudge, not {type(judge).__name__}")
