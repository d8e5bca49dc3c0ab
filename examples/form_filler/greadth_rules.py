"""GREADTH by program: a tape's agent turns, and the rules that decide criteria from the tape
and the simulated user's ground truth.

An **agent turn** is what the assistant does between two user messages: the steps after a
:class:`~tapekit.dialog.UserStep` up to the next one (or the tape's end), which should end in a
message to the user (:class:`PromptUserForTextMessageAction`), a submission
(:class:`CallFunctionAction`) or an exit (:class:`ExitAction`). The assistant's opening message
(before any user message) is not a turn: there is nothing to answer yet. The turn is
attributed to the behaviour that wrote the user message it answers (``metadata.agent``), whose
ground truth (``metadata.other["facts"]``, see ``users.py``) the rules read.

Each rule, when it applies to a turn, gives a :class:`Finding`: the criteria it decides, passed
or not, and why. A criterion's programmatic label is the AND of the findings about it, or
``None`` when no rule applied (the LLM judge, ``judge.py``, decides those). The rules read the
assistant's plan from its thoughts (the paper's design: every kind of answer has a planning
thought), so an agent that refuses or answers only in free text is judged by what its thoughts
say it did.

Invalid continuation, all six criteria 0 (``fatal``; the paper's "automatically gets 0"):

- ``unparsable``: an :class:`~tapekit.structured.LLMOutputParsingFailure` step in the turn;
- ``agent_error``: the tape's ``metadata.error`` (the agent failed during its last turn);
- ``no_ending``: the turn makes no message, submission or exit;
- ``invalid_value_filled``: an :class:`UpdateFunctionParametersThought` assigns a value the
  form rejects (``check_value``) or a slot the form does not have;
- ``failed_submission``: a :class:`CallFunctionAction` answered with an error (values missing
  or invalid, a form that is not the dialogue's).

Criteria (a rule marked *facts* needs the simulated user's ground truth on the user step):

- **Accurate**: ``intent`` (*facts*: the form imported is the user's; none when the user asked
  what the assistant can do or something impossible; no second form once one is selected; no
  form that does not exist), ``values_filled`` (*facts*: every value the user gave this turn is
  filled, exactly), ``unfounded_values`` (*facts*: every value assigned was given by the user,
  its latest value), ``skip_recorded`` (*facts*: a skip the user asked for is recorded),
  ``required_not_skipped`` (A, D: no required slot is skipped), ``update_in_form`` (updates only
  the selected form), ``refuses_only_invalid`` (*facts*: no valid value is refused).
- **Disciplined**: ``follows_plan`` (a turn that plans a message ends with one),
  ``required_not_skipped``, and with Responsive: ``refuses_invalid`` (*facts*: each invalid
  value gets a RefuseInvalidFunctionParameterValueThought), ``refuses_required_skip``
  (*facts*: RefuseSkippingParameterThought), ``refuses_impossible`` (*facts*:
  RefuseInexistentFunctionThought or RefuseToEngageThought), ``declines_off_topic`` (*facts*:
  RefuseToEngageThought).
- **Responsive** (and Helpful): ``answers_question`` (*facts*: a question the form's
  documentation answers gets an AnswerFromFunctionSchemaThought).
- **Helpful**: ``moves_forward`` (a message turn plans a request for the form, a slot, a
  confirmation or an exit confirmation), ``requests_open_slot`` (never asks for a slot already
  filled or skipped), ``confirms_when_complete`` (asks to confirm only when no slot is left),
  ``submits_after_confirmation`` (submits only after asking to confirm, and, *facts*, the user
  confirmed), ``submits_when_confirmed`` (*facts*: a confirmation is acted on), and
  ``exits_after_confirmation`` (exits only after asking whether the user wants to leave).
- **Grounded** (and Helpful): ``requests_known_slot`` (asks only for the form's slots);
  Grounded: ``offers_known_forms`` (offers only forms the environment listed).
- **Transparent**: ``acknowledges_changes`` (a text check: a message names each slot filled,
  changed or skipped in the turn, by its value or by its name, with or without underscores,
  ignoring case); how well it does so is the judge's call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from examples.form_filler.schema import check_value
from examples.form_filler.state import FormState, form_state
from examples.form_filler.steps import (
    AnswerFromFunctionSchemaThought,
    CallFunctionAction,
    ExitAction,
    FunctionCandidates,
    FunctionResult,
    FunctionSchemaObservation,
    InspectFunctionAction,
    NoAnswerInFunctionSchemaThought,
    PromptUserForTextMessageAction,
    RefuseInexistentFunctionThought,
    RefuseInvalidFunctionParameterValueThought,
    RefuseSkippingParameterThought,
    RefuseToEngageThought,
    RequestExitConfirmationThought,
    RequestFunctionCallConfirmationThought,
    RequestFunctionParametersThought,
    RequestFunctionThought,
    UpdateFunctionParametersThought,
)
from tapekit import Action, ControlStep, LLMOutputParsingFailure, Step, Tape, Thought, UserStep

__all__ = [
    "CRITERIA",
    "SHORT_NAMES",
    "AgentTurn",
    "Finding",
    "agent_turns",
    "check_turn",
    "rule_labels",
]

CRITERIA: tuple[str, ...] = ("grounded", "responsive", "accurate", "disciplined", "transparent", "helpful")
"""The six GREADTH criteria, in the acronym's order."""

SHORT_NAMES: dict[str, str] = {
    "grounded": "G",
    "responsive": "Re",
    "accurate": "A",
    "disciplined": "D",
    "transparent": "T",
    "helpful": "H",
}
"""The column names of the paper's Table 3."""

_ENDINGS = (PromptUserForTextMessageAction, CallFunctionAction, ExitAction)
_PLANS = (
    RequestFunctionParametersThought,
    RequestFunctionCallConfirmationThought,
    RequestExitConfirmationThought,
    RequestFunctionThought,
    AnswerFromFunctionSchemaThought,
    NoAnswerInFunctionSchemaThought,
    RefuseInvalidFunctionParameterValueThought,
    RefuseSkippingParameterThought,
    RefuseInexistentFunctionThought,
    RefuseToEngageThought,
)
_FORWARD = (
    RequestFunctionParametersThought,
    RequestFunctionCallConfirmationThought,
    RequestExitConfirmationThought,
    RequestFunctionThought,
)


class Finding(BaseModel):
    """One rule's verdict on a turn: the ``criteria`` it decides, whether they ``passed``, and
    ``detail`` (why). ``fatal``: an invalid continuation, all six criteria 0."""

    model_config = ConfigDict(frozen=True)

    rule: str
    criteria: tuple[str, ...]
    passed: bool
    detail: str = ""
    fatal: bool = False


@dataclass(frozen=True)
class AgentTurn:
    """The assistant's turn on ``tape`` answering the user step at ``user_at``: its steps are
    ``tape.steps[user_at + 1 : end]``; ``index`` counts the tape's turns from 0."""

    tape: Tape[Any, Any]
    index: int
    user_at: int
    end: int

    @property
    def user_step(self) -> UserStep:
        """The user message the turn answers."""
        step = self.tape.steps[self.user_at]
        assert isinstance(step, UserStep)
        return step

    @property
    def steps(self) -> list[Step]:
        """Everything in the turn: the agent's steps and the environment's observations."""
        return list(self.tape.steps[self.user_at + 1 : self.end])

    @property
    def agent_steps(self) -> list[Step]:
        """The agent's own thoughts and actions (control steps left out)."""
        return [s for s in self.steps if isinstance(s, Thought | Action) and not isinstance(s, ControlStep)]

    @property
    def facts(self) -> dict[str, Any] | None:
        """The simulated user's ground truth for this message, or ``None`` (no simulated user)."""
        facts = self.user_step.metadata.other.get("facts")
        return dict(facts) if isinstance(facts, dict) else None

    @property
    def behavior(self) -> str:
        """The user behaviour that wrote the message (``"(unlabelled)"`` when none is named)."""
        facts = self.facts or {}
        return self.user_step.metadata.agent or str(facts.get("behavior") or "") or "(unlabelled)"

    @property
    def ending(self) -> Action | None:
        """The turn's last message, submission or exit (``None`` if it made none)."""
        return next((s for s in reversed(self.steps) if isinstance(s, _ENDINGS)), None)

    @property
    def is_last(self) -> bool:
        """Whether no user message follows (the tape's error, if any, belongs to this turn)."""
        return self.end == len(self.tape.steps)

    @property
    def message(self) -> str:
        """What the assistant said to end the turn ('' for a submission or no ending)."""
        ending = self.ending
        if isinstance(ending, PromptUserForTextMessageAction):
            return ending.prompt
        if isinstance(ending, ExitAction):
            return ending.text
        return ""


def agent_turns(tape: Tape[Any, Any], last_only: bool = False) -> list[AgentTurn]:
    """The assistant's turns on ``tape``: one per user message the assistant answered (with at
    least one step of its own, or the tape's error). ``last_only``: only the last one (for
    tapes that are a partial dialogue plus one continuation by the agent under evaluation)."""
    steps = tape.steps
    users = [i for i, s in enumerate(steps) if isinstance(s, UserStep)]
    turns: list[AgentTurn] = []
    for k, at in enumerate(users):
        end = users[k + 1] if k + 1 < len(users) else len(steps)
        turn = AgentTurn(tape=tape, index=len(turns), user_at=at, end=end)
        if turn.agent_steps or (turn.is_last and tape.metadata.error):
            turns.append(turn)
    return turns[-1:] if last_only else turns


# --------------------------------------------------------------------------- rules


@dataclass
class _Context:
    turn: AgentTurn
    steps: list[Step]
    asked: FormState  # before the user's message: what the assistant had asked
    after: FormState  # at the end of the turn
    facts: dict[str, Any] | None
    given: dict[str, Any] | None  # the latest value the user gave per slot, when every user step has facts

    def of(self, *kinds: type[Step]) -> list[Any]:
        return [s for s in self.steps if isinstance(s, kinds)]


def _norm(value: Any) -> str:
    return str(value).strip().casefold()


def _given_so_far(tape: Tape[Any, Any], until: int) -> dict[str, Any] | None:
    given: dict[str, Any] = {}
    for step in tape.steps[: until + 1]:
        if isinstance(step, UserStep):
            facts = step.metadata.other.get("facts")
            if not isinstance(facts, dict):
                return None
            given.update(facts.get("values") or {})
    return given


def _fatal(ctx: _Context) -> Iterator[Finding]:
    def fail(rule: str, detail: str) -> Finding:
        return Finding(rule=rule, criteria=CRITERIA, passed=False, detail=detail, fatal=True)

    for failure in ctx.of(LLMOutputParsingFailure):
        yield fail("unparsable", f"the LLM's output could not be parsed: {failure.error}")
    error = ctx.turn.tape.metadata.error
    if ctx.turn.is_last and error:
        yield fail("agent_error", f"the agent failed: {error}")
    if ctx.turn.ending is None:
        yield fail("no_ending", "the turn ends without a message, a submission or an exit")
    schema = ctx.after.schema
    for update in ctx.of(UpdateFunctionParametersThought):
        if schema is None or update.function != schema.name:
            continue
        for name, value in update.assign.items():
            if name not in schema.parameters.properties:
                yield fail("invalid_value_filled", f"filled {name!r}, which {schema.name} does not have")
            elif (problem := check_value(schema.parameter(name), value)) is not None:
                yield fail("invalid_value_filled", f"filled {name} with an invalid value: {problem}")
    for result in ctx.of(FunctionResult):
        if result.error is not None:
            yield fail("failed_submission", result.error)


def _accurate(ctx: _Context) -> Iterator[Finding]:
    schema, facts = ctx.after.schema, ctx.facts
    inspected = [a.function for a in ctx.of(InspectFunctionAction)]
    for obs in ctx.of(FunctionSchemaObservation):
        if obs.error is not None:
            yield Finding(rule="intent", criteria=("accurate",), passed=False, detail=obs.error)
    if ctx.asked.schema is not None:
        other = [f for f in inspected if f != ctx.asked.schema.name]
        if other:
            detail = f"imported {other[0]} while the dialogue is about {ctx.asked.schema.name}"
            yield Finding(rule="intent", criteria=("accurate",), passed=False, detail=detail)
    elif facts is not None:
        yield from _intent(ctx, facts, inspected)
    for update in ctx.of(UpdateFunctionParametersThought):
        if schema is None or update.function != schema.name:
            where = schema.name if schema else "no form selected yet"
            detail = f"updated {update.function} ({where})"
            yield Finding(rule="update_in_form", criteria=("accurate",), passed=False, detail=detail)
    if schema is not None:
        required = [
            n for u in ctx.of(UpdateFunctionParametersThought) for n in u.skip if schema.is_required(n)
        ]
        yield from _verdict("required_not_skipped", ("accurate", "disciplined"), required, "skipped required")
    if facts is None or schema is None or facts.get("intent") not in (None, schema.name):
        return
    values = dict(facts.get("values") or {})
    if values:
        wrong = [
            n
            for n, v in values.items()
            if n not in ctx.after.filled or _norm(ctx.after.filled[n]) != _norm(v)
        ]
        yield from _verdict("values_filled", ("accurate",), wrong, "not filled as the user said")
    if ctx.given is not None:
        assigned = {n: v for u in ctx.of(UpdateFunctionParametersThought) for n, v in u.assign.items()}
        if assigned:
            unfounded = [
                n for n, v in assigned.items() if n not in ctx.given or _norm(ctx.given[n]) != _norm(v)
            ]
            yield from _verdict(
                "unfounded_values", ("accurate",), unfounded, "filled with values the user did not give"
            )
    asked_skips = list(facts.get("skip") or [])
    if asked_skips:
        missed = [n for n in asked_skips if n not in ctx.after.skipped]
        yield from _verdict("skip_recorded", ("accurate",), missed, "the user asked to skip, not skipped")
    refused = [r.parameter for r in ctx.of(RefuseInvalidFunctionParameterValueThought)]
    if refused:
        valid = [n for n in refused if n in values and n not in (facts.get("invalid") or {})]
        yield from _verdict("refuses_only_invalid", ("accurate",), valid, "refused a valid value for")


def _intent(ctx: _Context, facts: dict[str, Any], inspected: list[str]) -> Iterator[Finding]:
    """Before a form is selected: the form the user wants, or none when they asked for none."""
    if facts.get("asks_capabilities") or facts.get("impossible"):
        detail = f"imported {inspected[0]} though the user asked for no form" if inspected else ""
        yield Finding(rule="intent", criteria=("accurate",), passed=not inspected, detail=detail)
        return
    intent = facts.get("intent")
    if intent is None:
        return
    offered = [f for r in ctx.of(RequestFunctionThought) for f in r.functions]
    if inspected:
        ok = inspected == [intent]
        detail = "" if ok else f"imported {', '.join(inspected)}; the user wants {intent}"
    else:
        ok = intent in offered
        detail = "" if ok else f"the user asked for {intent}; it was neither imported nor offered"
    yield Finding(rule="intent", criteria=("accurate",), passed=ok, detail=detail)


def _verdict(rule: str, criteria: tuple[str, ...], bad: Sequence[str], what: str) -> Iterator[Finding]:
    yield Finding(
        rule=rule, criteria=criteria, passed=not bad, detail=f"{what}: {', '.join(bad)}" if bad else ""
    )


def _refusals(ctx: _Context) -> Iterator[Finding]:
    facts = ctx.facts
    if facts is None:
        return
    both = ("disciplined", "responsive")
    invalid = dict(facts.get("invalid") or {})
    if invalid:
        refused = {r.parameter for r in ctx.of(RefuseInvalidFunctionParameterValueThought)}
        missed = [f"{n}={v!r}" for n, v in invalid.items() if n not in refused]
        yield from _verdict("refuses_invalid", both, missed, "invalid value not refused")
    skip_required = list(facts.get("skip_required") or [])
    if skip_required:
        refused = {r.parameter for r in ctx.of(RefuseSkippingParameterThought)}
        missed = [n for n in skip_required if n not in refused]
        yield from _verdict("refuses_required_skip", both, missed, "required slot's skip not refused")
    if facts.get("impossible"):
        ok = bool(ctx.of(RefuseInexistentFunctionThought, RefuseToEngageThought))
        yield Finding(
            rule="refuses_impossible",
            criteria=both,
            passed=ok,
            detail="" if ok else "an impossible ask not refused",
        )
    if facts.get("off_topic"):
        ok = bool(ctx.of(RefuseToEngageThought))
        yield Finding(
            rule="declines_off_topic",
            criteria=both,
            passed=ok,
            detail="" if ok else "an off-topic ask not declined",
        )
    if facts.get("question_about") and facts.get("answerable"):
        ok = bool(ctx.of(AnswerFromFunctionSchemaThought))
        detail = "" if ok else f"the question about {facts['question_about']} (documented) not answered"
        yield Finding(rule="answers_question", criteria=("responsive", "helpful"), passed=ok, detail=detail)


def _plan(ctx: _Context) -> Iterator[Finding]:
    ending, after = ctx.turn.ending, ctx.after
    plans = ctx.of(*_PLANS)
    if plans:
        ok = isinstance(ending, PromptUserForTextMessageAction)
        detail = (
            "" if ok else f"planned {plans[0].kind} but ended with {ending.kind if ending else 'nothing'}"
        )
        yield Finding(rule="follows_plan", criteria=("disciplined",), passed=ok, detail=detail)
    if isinstance(ending, PromptUserForTextMessageAction):
        ok = bool(ctx.of(*_FORWARD))
        detail = "" if ok else "the message requests no form, slot or confirmation"
        yield Finding(rule="moves_forward", criteria=("helpful",), passed=ok, detail=detail)
    for request in ctx.of(RequestFunctionParametersThought):
        name = request.parameters[0]
        known = after.schema is not None and name in after.schema.parameters.properties
        yield Finding(
            rule="requests_known_slot",
            criteria=("grounded", "helpful"),
            passed=known,
            detail="" if known else f"asked for {name!r}, which the form does not have",
        )
        if known:
            done = name in after.filled or name in after.skipped
            detail = (
                f"asked for {name}, already {'filled' if name in after.filled else 'skipped'}" if done else ""
            )
            yield Finding(rule="requests_open_slot", criteria=("helpful",), passed=not done, detail=detail)
    if ctx.of(RequestFunctionCallConfirmationThought):
        left = after.unfilled() if after.schema is not None else ["(no form selected)"]
        yield from _verdict("confirms_when_complete", ("helpful",), left, "asked to confirm with slots left")
    yield from _endings(ctx)
    seen = {
        c.name
        for s in ctx.turn.tape.steps[: ctx.turn.end]
        if isinstance(s, FunctionCandidates)
        for c in s.candidates
    }
    for request in ctx.of(RequestFunctionThought):
        if seen or not request.functions:
            unknown = [f for f in request.functions if f not in seen]
            yield from _verdict(
                "offers_known_forms", ("grounded",), unknown, "offered forms that were not listed"
            )


def _endings(ctx: _Context) -> Iterator[Finding]:
    facts = ctx.facts
    submitted = bool(ctx.of(CallFunctionAction))
    if submitted:
        ok = ctx.asked.confirmation_requested and (facts is None or bool(facts.get("confirms")))
        detail = "" if ok else "submitted without the user's confirmation"
        yield Finding(rule="submits_after_confirmation", criteria=("helpful",), passed=ok, detail=detail)
    if facts is not None and facts.get("confirms"):
        detail = "" if submitted else "the user confirmed; nothing was submitted"
        yield Finding(rule="submits_when_confirmed", criteria=("helpful",), passed=submitted, detail=detail)
    if ctx.of(ExitAction):
        ok = ctx.asked.exit_confirmation_requested
        detail = "" if ok else "exited without asking whether the user wants to leave"
        yield Finding(rule="exits_after_confirmation", criteria=("helpful",), passed=ok, detail=detail)


def _transparent(ctx: _Context) -> Iterator[Finding]:
    message = ctx.turn.message.casefold()
    if not isinstance(ctx.turn.ending, PromptUserForTextMessageAction):
        return
    changed = {n: v for u in ctx.of(UpdateFunctionParametersThought) for n, v in u.assign.items()}
    changed |= {n: None for u in ctx.of(UpdateFunctionParametersThought) for n in u.skip}
    if changed:
        silent = [
            n
            for n, v in changed.items()
            if n.casefold() not in message
            and n.replace("_", " ").casefold() not in message
            and (v is None or _norm(v) not in message)
        ]
        yield from _verdict("acknowledges_changes", ("transparent",), silent, "the message does not mention")


def check_turn(turn: AgentTurn) -> list[Finding]:
    """Every rule's findings on ``turn``, each once (fatal ones first)."""
    tape = turn.tape
    ctx = _Context(
        turn=turn,
        steps=turn.steps,
        asked=form_state(tape.steps[: turn.user_at]),
        after=form_state(tape.steps[: turn.end]),
        facts=turn.facts,
        given=_given_so_far(tape, turn.user_at),
    )
    findings = [*_fatal(ctx)]
    for rules in (_accurate, _refusals, _plan, _transparent):
        findings.extend(rules(ctx))
    return list(dict.fromkeys(findings))  # a retried failure is one finding


def rule_labels(findings: Sequence[Finding]) -> dict[str, bool | None]:
    """Each criterion's programmatic label: the AND of the findings about it, ``None`` if none."""
    labels: dict[str, bool | None] = dict.fromkeys(CRITERIA)
    for finding in findings:
        for criterion in finding.criteria:
            labels[criterion] = finding.passed and labels[criterion] is not False
    return labels
