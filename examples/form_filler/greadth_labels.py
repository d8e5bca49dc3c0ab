"""GREADTH labels of agent turns: the rules' findings and the judge's verdicts combined.

A criterion's label is the AND of the rules that applied to it (``greadth_rules.py``) and the
judge's answer (``judge.py``); with neither it counts as passed and :meth:`TurnLabels.source`
says ``default``. An invalid continuation (a fatal finding) gets 0 on all six, and the judge
is not asked about it. ``greadth.py`` gathers these labels into the report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field

from examples.form_filler.greadth_rules import (
    CRITERIA,
    AgentTurn,
    Finding,
    agent_turns,
    check_turn,
    rule_labels,
)
from examples.form_filler.judge import GreadthJudge, JudgeVerdict, as_judge
from tapekit import Tape

__all__ = ["Source", "TurnLabels", "label_turns", "labelled_turns"]

Source = Literal["rule", "judge", "rule+judge", "default", "invalid"]


class TurnLabels(BaseModel):
    """One agent turn's labels: where it is (``tape_id``, ``turn``, the user step's index
    ``user_index`` and the turn's end ``end_index``), the user ``behavior`` it answers, the
    rules' ``findings`` and per-criterion ``rules`` labels, the judge's verdicts, the final
    ``labels``, ``greadth`` (their AND), and the turn's LLM calls, tokens and cost."""

    tape_id: str
    turn: int
    user_index: int
    end_index: int
    behavior: str
    intent: str | None = None
    user_message: str = ""
    agent_message: str = ""
    ending: str = ""
    valid: bool = True
    findings: list[Finding] = Field(default_factory=list)
    rules: dict[str, bool | None] = Field(default_factory=dict)
    judge: dict[str, JudgeVerdict] = Field(default_factory=dict)
    labels: dict[str, bool] = Field(default_factory=dict)
    greadth: bool = False
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    models: list[str] = Field(default_factory=list)

    def source(self, criterion: str) -> Source:
        """What decided ``criterion``: the rules, the judge, both, neither (``default``: passed),
        or an invalid continuation."""
        if not self.valid:
            return "invalid"
        rule = self.rules.get(criterion) is not None
        verdict = self.judge.get(criterion)
        judged = verdict is not None and verdict.answer is not None
        return "rule+judge" if rule and judged else "rule" if rule else "judge" if judged else "default"

    def failed_rules(self) -> list[Finding]:
        """The findings that did not pass (why a label is 0)."""
        return [f for f in self.findings if not f.passed]


def _labels(turn: AgentTurn, verdicts: dict[str, JudgeVerdict] | None) -> TurnLabels:
    findings = check_turn(turn)
    rules = rule_labels(findings)
    valid = not any(f.fatal for f in findings)
    labels: dict[str, bool] = {}
    for criterion in CRITERIA:
        parts = [] if rules[criterion] is None else [bool(rules[criterion])]
        verdict = (verdicts or {}).get(criterion)
        if verdict is not None and verdict.answer is not None:
            parts.append(verdict.answer)
        labels[criterion] = valid and all(parts)
    ending = turn.ending
    return TurnLabels(
        tape_id=turn.tape.metadata.id,
        turn=turn.index,
        user_index=turn.user_at,
        end_index=turn.end,
        behavior=turn.behavior,
        intent=(turn.facts or {}).get("intent"),
        user_message=turn.user_step.content,
        agent_message=turn.message,
        ending=ending.kind if ending is not None else "",
        valid=valid,
        findings=findings,
        rules=rules,
        judge=dict(verdicts or {}),
        labels=labels,
        greadth=all(labels.values()),
    )


def label_turns(
    tapes: Iterable[Tape[Any, Any]], judge: GreadthJudge | Any = None, last_only: bool = False
) -> list[TurnLabels]:
    """The labels of every agent turn of ``tapes`` (the judge, if any, is asked about each
    valid turn; invalid continuations are 0 without asking)."""
    return [labels for labels, _ in labelled_turns(tapes, as_judge(judge), last_only)]


def labelled_turns(
    tapes: Iterable[Tape[Any, Any]], judge: GreadthJudge | None, last_only: bool
) -> list[tuple[TurnLabels, AgentTurn]]:
    """Each turn's labels with the turn itself (for its LLM calls), in tape order."""
    if isinstance(tapes, Tape):
        raise TypeError("pass a list of tapes, not one Tape: [tape]")
    turns = [t for tape in tapes for t in agent_turns(tape, last_only=last_only)]
    verdicts: list[dict[str, JudgeVerdict] | None] = [None] * len(turns)
    if judge is not None:
        valid = [i for i, t in enumerate(turns) if not any(f.fatal for f in check_turn(t))]
        answers = asyncio.run(judge.ajudge([turns[i] for i in valid]))
        for i, answer in zip(valid, answers, strict=True):
            verdicts[i] = answer
    return [(_labels(t, v), t) for t, v in zip(turns, verdicts, strict=True)]
