"""GREADTH evaluation of form-filling agents (section 5.2, Tables 3, 4 and 7 of the paper).

Every agent turn (see :func:`~examples.form_filler.greadth_rules.agent_turns`) gets six binary
labels, Grounded, REsponsive, Accurate, Disciplined, Transparent, Helpful, and their AND, the
GREADTH score. Rules decide what the tape and the simulated user's ground truth make decidable
(``greadth_rules.py`` lists each rule and the criteria it feeds; an invalid continuation, such
as unparsable output or a failed submission, gets 0 on all six); an optional LLM judge
(``judge.py``) answers one yes/no prompt per criterion. A criterion's label is the AND of
the rules that applied and the judge's answer; with neither (no rule applied, no judge or an
unparsable answer) it counts as passed, and the report says how many labels were so
defaulted (``sources``). Where a rule and the judge both gave a label, the report gives their
agreement per criterion.

API (stable; ``run.py`` calls it):

- ``greadth_report(tapes_by_agent, judge=None, prices=None, *, llm_calls=None,
  priced_as=None, last_only=False, seed=0, n_bootstrap=10000, confidence=0.95) ->
  GreadthReport``: ``tapes_by_agent`` maps an agent's label ("teacher", "student (tuned)")
  to its tapes; ``judge`` is a tapekit LLM or a :class:`~examples.form_filler.judge.GreadthJudge`;
  ``prices`` maps a model name to a :class:`~examples.form_filler.costs.Price` (or a pair of
  dollars per million prompt and completion tokens); ``llm_calls`` finds the turns' LLM calls
  (``{prompt id: LLMCall}``, a store, or a function; without it tokens are "not measured");
  ``priced_as`` maps an agent label to the model whose price its calls get (an offline oracle
  priced as the model it stands in for), otherwise each call's own ``model`` is looked up and an
  unknown model is an error; without ``prices`` the calls' own ``cost`` is used. ``last_only``
  scores only each tape's last turn (a partial dialogue plus one continuation).
- :class:`GreadthReport`: ``.table()`` (Table 3: each criterion and GREADTH with bootstrap
  intervals), ``.behavior_table()`` (Table 7: GREADTH per user behaviour), ``.cost_table()``
  (Table 4: tokens per turn, cost per million turns), ``.agreement_table()`` (judge vs rules),
  ``.score(agent, metric, behavior)``, ``.costs(agent)``, ``.agreement(agent)``,
  ``.sources(agent)``, ``.pass_sources(agent)`` (per criterion, the passes a rule or the
  judge decided and those by default; ``.pass_sources_table()``), ``.cost_ratios(teacher,
  student)`` (token ratio, price ratio and their product, per turn and per passing turn),
  ``.to_text()``, ``.print()``, ``.to_json()``, ``.save(path)``,
  ``GreadthReport.load(path)``; ``.turns[agent]`` holds each turn's :class:`TurnLabels`;
  ``.split`` names the data split the turns come from (``run.py``: ``val``, ``test`` or
  ``fresh``); ``.token_counting`` says per agent how its tokens were counted.
- Paired comparisons of two agents on the same turns (the same partial dialogues continued, in
  the same order): ``.paired(a, b, metric)`` -> :class:`Paired` (the mean of ``a - b`` with a
  bootstrap interval over turn pairs, the discordant counts and the exact McNemar p-value,
  from ``tapekit.evaluate.paired_difference`` and ``mcnemar_exact``), ``.gap_closed(student,
  zero, teacher, metric)`` (``(student - zero) / (teacher - zero)`` with a bootstrap interval
  over turn indices) and ``.paired_table(pairs)``.
- ``label_turns(tapes, judge=None, last_only=False) -> list[TurnLabels]`` for one agent;
  ``passes_rules(tape)``: whether every agent turn of ``tape`` passes every rule (for
  filtering teacher tapes before distillation).

Intervals are seeded percentile bootstraps over turns (``tapekit``'s evaluation bootstrap).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from examples.form_filler.behaviors import BEHAVIOR_NAMES
from examples.form_filler.costs import Price, call_lookup, check_prices, turn_calls
from examples.form_filler.greadth_labels import TurnLabels, label_turns, labelled_turns
from examples.form_filler.greadth_rules import CRITERIA, SHORT_NAMES
from examples.form_filler.judge import GreadthJudge, as_judge
from tapekit import Tape
from tapekit.evaluate import Estimate, JsonReport, bootstrap_mean, mcnemar_exact, paired_difference
from tapekit.llm import LLMCall

__all__ = [
    "METRICS",
    "Agreement",
    "GreadthReport",
    "Paired",
    "TurnLabels",
    "greadth_report",
    "label_turns",
    "passes_rules",
]

METRICS: tuple[str, ...] = (*CRITERIA, "greadth")
"""The six criteria and the GREADTH score (their AND)."""


class Agreement(BaseModel):
    """The judge against the rules on one criterion, over the turns where both labelled it:
    ``n`` turns, ``agree``, ``rule_yes_judge_no``, ``rule_no_judge_yes``, and the ``rate``
    (``agree / n``; ``None`` when ``n`` is 0)."""

    n: int = 0
    agree: int = 0
    rule_yes_judge_no: int = 0
    rule_no_judge_yes: int = 0

    @property
    def rate(self) -> float | None:
        """The share of turns on which they agree."""
        return self.agree / self.n if self.n else None


class Paired(BaseModel):
    """Agent ``a`` against agent ``b`` on ``metric`` over ``n`` paired turns: ``difference``
    (the mean of ``a - b``, pass = 1, with its paired bootstrap interval), ``a_only`` turns that
    ``a`` passes and ``b`` fails, ``b_only`` the reverse, and ``p_value`` (two-sided exact
    McNemar over the discordant turns)."""

    a: str
    b: str
    metric: str
    n: int
    difference: Estimate
    a_only: int
    b_only: int
    p_value: float


def _interval(values: list[float], confidence: float, centre: float) -> Estimate:
    """The percentile interval of bootstrap ``values`` around ``centre`` (NaN if none)."""
    if not values:
        return Estimate(value=centre, low=math.nan, high=math.nan)
    values.sort()
    m, tail = len(values), (1.0 - confidence) / 2.0
    low = values[min(m - 1, math.floor(tail * m))]
    high = values[min(m - 1, math.ceil((1.0 - tail) * m) - 1)]
    return Estimate(value=centre, low=min(low, centre), high=max(high, centre))


def _points(e: Estimate) -> str:
    if e.value != e.value:  # NaN: no turns
        return "-"
    return f"{100 * e.value:+.1f} [{100 * e.low:+.1f}, {100 * e.high:+.1f}]"


def _pct(e: Estimate) -> str:
    if e.value != e.value:  # NaN: no turns
        return "-"
    return f"{100 * e.value:.1f}% [{100 * e.low:.1f}, {100 * e.high:.1f}]"


class GreadthReport(JsonReport):
    """GREADTH labels of every agent's turns, and the tables over them (see the module doc)."""

    turns: dict[str, list[TurnLabels]] = Field(default_factory=dict)
    judge_model: str | None = None
    split: str | None = None
    prices: dict[str, Price] | None = None
    priced_as: dict[str, str] = Field(default_factory=dict)
    tokens_measured: bool = False
    token_counting: dict[str, str] = Field(default_factory=dict)
    seed: int = 0
    n_bootstrap: int = 10_000
    confidence: float = 0.95
    _cache: dict[tuple[str, str, str | None], Estimate] = PrivateAttr(default_factory=dict)

    @property
    def agents(self) -> list[str]:
        """The agents' labels, in the order given."""
        return list(self.turns)

    def _turns(self, agent: str, behavior: str | None = None) -> list[TurnLabels]:
        if agent not in self.turns:
            raise KeyError(f"no agent {agent!r} in the report; agents: {self.agents}")
        turns = self.turns[agent]
        return turns if behavior is None else [t for t in turns if t.behavior == behavior]

    def behaviors(self) -> list[str]:
        """The user behaviours seen, the paper's 19 first (in its order), then any others."""
        seen = {t.behavior for turns in self.turns.values() for t in turns}
        return [b for b in BEHAVIOR_NAMES if b in seen] + sorted(seen - set(BEHAVIOR_NAMES))

    def score(self, agent: str, metric: str = "greadth", behavior: str | None = None) -> Estimate:
        """The share of ``agent``'s turns (answering ``behavior``, or all) that pass ``metric``
        (a criterion or ``greadth``), with its bootstrap interval (NaN with no turns)."""
        if metric not in METRICS:
            raise ValueError(f"no metric {metric!r}; metrics: {list(METRICS)}")
        key = (agent, metric, behavior)
        if key not in self._cache:
            turns = self._turns(agent, behavior)
            values = [float(t.greadth if metric == "greadth" else t.labels[metric]) for t in turns]
            self._cache[key] = bootstrap_mean(values, self.n_bootstrap, self.confidence, self.seed)
        return self._cache[key]

    def agreement(self, agent: str | None = None) -> dict[str, Agreement]:
        """Per criterion, the judge's agreement with the rules (over one agent's turns, or all)."""
        agents = self.agents if agent is None else [agent]
        out = {c: Agreement() for c in CRITERIA}
        for turn in (t for a in agents for t in self._turns(a)):
            for criterion, verdict in turn.judge.items():
                rule = turn.rules.get(criterion)
                if rule is None or verdict.answer is None:
                    continue
                a = out[criterion]
                a.n += 1
                a.agree += rule == verdict.answer
                a.rule_yes_judge_no += rule and not verdict.answer
                a.rule_no_judge_yes += (not rule) and verdict.answer
        return out

    def judge_unparsable(self, agent: str | None = None) -> dict[str, int]:
        """Per criterion, how many judge answers were neither yes nor no."""
        agents = self.agents if agent is None else [agent]
        turns = [t for a in agents for t in self._turns(a)]
        return {c: sum(c in t.judge and t.judge[c].answer is None for t in turns) for c in CRITERIA}

    def sources(self, agent: str) -> dict[str, dict[str, int]]:
        """Per criterion, how many of ``agent``'s labels each source decided."""
        kinds = ("rule", "judge", "rule+judge", "default", "invalid")
        out = {c: dict.fromkeys(kinds, 0) for c in CRITERIA}
        for turn in self._turns(agent):
            for criterion in CRITERIA:
                out[criterion][turn.source(criterion)] += 1
        return out

    def pass_sources(self, agent: str) -> dict[str, dict[str, int]]:
        """Per criterion, ``agent``'s turns that pass it by what decided the pass: ``rule`` (a
        rule applied and passed), ``judge``, ``rule+judge``, or ``default`` (neither: the
        criterion counts as passed because nothing decided it); ``passed`` is their sum and
        ``failed`` the other turns. Under ``greadth``: the turns passing all six, ``passed``,
        split into ``all_decided`` (every criterion decided by a rule or the judge) and
        ``some_default`` (at least one passed by default)."""
        turns = self._turns(agent)
        out: dict[str, dict[str, int]] = {}
        for criterion in CRITERIA:
            counts = dict.fromkeys(("rule", "judge", "rule+judge", "default"), 0)
            for turn in turns:
                if turn.labels.get(criterion):
                    counts[turn.source(criterion)] += 1
            passed = sum(counts.values())
            out[criterion] = {**counts, "passed": passed, "failed": len(turns) - passed}
        passing = [t for t in turns if t.greadth]
        some = sum(any(t.source(c) == "default" for c in CRITERIA) for t in passing)
        out["greadth"] = {
            "passed": len(passing),
            "all_decided": len(passing) - some,
            "some_default": some,
            "failed": len(turns) - len(passing),
        }
        return out

    def cost_ratios(self, expensive: str, cheap: str) -> dict[str, Any]:
        """``expensive`` (the teacher) against ``cheap`` (a student), the cost ratio and its two
        factors kept apart: ``token_ratio`` (tokens per turn, prompt and completion together),
        ``price_ratio`` (the mean price per token the calls were charged: the cost ratio over
        the token ratio, an assumption of the price table, not a measurement), and
        ``cost_ratio`` (their product), each per turn and per turn passing GREADTH (``None``
        where ``cheap`` passes no turn or tokens were not measured); ``list_price_ratios``: the
        price table's prompt and completion ratios of the two priced models."""
        a, b = self.costs(expensive), self.costs(cheap)
        out: dict[str, Any] = {"expensive": expensive, "cheap": cheap}
        if a["cost_per_turn"] is None or b["cost_per_turn"] is None:
            return {**out, "per_turn": None, "per_passing_turn": None, "list_price_ratios": None}
        tokens_a = a["prompt_tokens_per_turn"] + a["completion_tokens_per_turn"]
        tokens_b = b["prompt_tokens_per_turn"] + b["completion_tokens_per_turn"]

        def ratio(x: float, y: float) -> float | None:
            return x / y if y else None

        token_ratio = ratio(tokens_a, tokens_b)
        cost_ratio = ratio(a["cost_per_turn"], b["cost_per_turn"])
        price_ratio = ratio(cost_ratio, token_ratio) if cost_ratio is not None and token_ratio else None
        per_turn = {"token_ratio": token_ratio, "price_ratio": price_ratio, "cost_ratio": cost_ratio}
        passes_a = sum(t.greadth for t in self._turns(expensive))
        passes_b = sum(t.greadth for t in self._turns(cheap))
        per_passing: dict[str, float | None] | None = None
        if passes_a and passes_b:  # per passing turn: each agent's totals over its passing turns
            n_a, n_b = len(self._turns(expensive)), len(self._turns(cheap))
            scale = (n_a / passes_a) / (n_b / passes_b)
            per_passing = {
                "token_ratio": token_ratio * scale if token_ratio is not None else None,
                "price_ratio": price_ratio,
                "cost_ratio": cost_ratio * scale if cost_ratio is not None else None,
            }
        lists = None
        pa, pb = self.priced_as.get(expensive), self.priced_as.get(cheap)
        if self.prices and pa in self.prices and pb in self.prices:
            x, y = self.prices[pa], self.prices[pb]
            lists = {"prompt": ratio(x.prompt, y.prompt), "completion": ratio(x.completion, y.completion)}
        return {
            **out,
            "passing_turns": {expensive: passes_a, cheap: passes_b},
            "per_turn": per_turn,
            "per_passing_turn": per_passing,
            "list_price_ratios": lists,
        }

    def costs(self, agent: str) -> dict[str, Any]:
        """``agent``'s turns, LLM calls, prompt and completion tokens per turn, dollars per turn
        and per million turns, and the models (``None`` figures when tokens were not measured)."""
        turns = self._turns(agent)
        n = max(len(turns), 1)
        measured = self.tokens_measured
        per_turn = sum(t.cost for t in turns) / n if measured else None
        return {
            "turns": len(turns),
            "llm_calls_per_turn": sum(t.llm_calls for t in turns) / n if measured else None,
            "prompt_tokens_per_turn": sum(t.prompt_tokens for t in turns) / n if measured else None,
            "completion_tokens_per_turn": sum(t.completion_tokens for t in turns) / n if measured else None,
            "cost_per_turn": per_turn,
            "cost_per_million_turns": per_turn * 1e6 if per_turn is not None else None,
            "models": sorted({m for t in turns for m in t.models}),
            "priced_as": self.priced_as.get(agent),
        }

    # ------------------------------------------------------------------ paired

    def outcomes(self, agent: str, metric: str = "greadth") -> list[bool]:
        """Whether each of ``agent``'s turns passes ``metric``, in the report's turn order."""
        if metric not in METRICS:
            raise ValueError(f"no metric {metric!r}; metrics: {list(METRICS)}")
        return [t.greadth if metric == "greadth" else t.labels[metric] for t in self._turns(agent)]

    def _check_paired(self, *agents: str) -> None:
        """The agents' turns must answer the same user messages in the same order."""
        first = self._turns(agents[0])
        for other in agents[1:]:
            turns = self._turns(other)
            if len(turns) != len(first):
                raise ValueError(
                    f"{agents[0]!r} has {len(first)} turns and {other!r} {len(turns)}: not paired"
                )
            for i, (x, y) in enumerate(zip(first, turns, strict=True)):
                if (x.behavior, x.user_message) != (y.behavior, y.user_message):
                    raise ValueError(f"turn {i} of {agents[0]!r} and of {other!r} answer different messages")

    def paired(self, a: str, b: str, metric: str = "greadth") -> Paired:
        """``a`` against ``b`` on the same turns (see :class:`Paired`); ``ValueError`` if the
        two agents' turns do not answer the same user messages in the same order."""
        self._check_paired(a, b)
        x, y = self.outcomes(a, metric), self.outcomes(b, metric)
        diff = paired_difference(
            [float(v) for v in x], [float(v) for v in y], None, self.n_bootstrap, self.confidence, self.seed
        )
        return Paired(
            a=a,
            b=b,
            metric=metric,
            n=len(x),
            difference=diff,
            a_only=sum(p and not q for p, q in zip(x, y, strict=True)),
            b_only=sum(q and not p for p, q in zip(x, y, strict=True)),
            p_value=mcnemar_exact(x, y),
        )

    def gap_closed(self, student: str, zero: str, teacher: str, metric: str = "greadth") -> Estimate:
        """The share of the gap between ``zero`` and ``teacher`` that ``student`` closes,
        ``(student - zero) / (teacher - zero)`` of the pass rates, with a bootstrap interval
        that resamples turn indices (all three agents' turns together); resamples where the
        teacher and ``zero`` tie are left out. NaN when they tie on the turns themselves."""
        self._check_paired(student, zero, teacher)
        s, z, t = (self.outcomes(a, metric) for a in (student, zero, teacher))
        n = len(s)

        def ratio(index: Sequence[int]) -> float | None:
            gap = sum(t[i] for i in index) - sum(z[i] for i in index)
            return None if gap == 0 else (sum(s[i] for i in index) - sum(z[i] for i in index)) / gap

        centre = ratio(range(n))
        if centre is None:
            return Estimate(value=math.nan, low=math.nan, high=math.nan)
        rng = random.Random(self.seed)
        draws = [ratio([rng.randrange(n) for _ in range(n)]) for _ in range(self.n_bootstrap)]
        return _interval([d for d in draws if d is not None], self.confidence, centre)

    def paired_table(self, pairs: Sequence[tuple[str, str]], title: str | None = None) -> Any:
        """Per pair ``(a, b)``: ``a - b`` in points on each criterion and on GREADTH (with its
        paired interval; :meth:`paired` has every criterion's), GREADTH's discordant turns and
        McNemar p-value (``rich`` table)."""
        from rich.table import Table

        split = f" on the {self.split} split" if self.split else ""
        level = f"{self.confidence:.0%}"
        table = Table(title=title or f"Paired differences{split} (points, {level} interval over turns)")
        table.add_column("a - b")
        table.add_column("turns", justify="right")
        for metric in METRICS:
            table.add_column("GREADTH" if metric == "greadth" else SHORT_NAMES[metric], justify="right")
        table.add_column("a only / b only", justify="right")
        table.add_column("McNemar p", justify="right")
        for a, b in pairs:
            cells = []
            for metric in METRICS:
                d = self.paired(a, b, metric).difference
                cells.append(_points(d) if metric == "greadth" else _points(d).split(" [")[0])
            g = self.paired(a, b)
            table.add_row(f"{a} - {b}", str(g.n), *cells, f"{g.a_only} / {g.b_only}", f"{g.p_value:.3g}")
        return table

    # ------------------------------------------------------------------ tables

    def table(self, title: str | None = None) -> Any:
        """Table 3: per agent, each criterion and GREADTH with 95% intervals (``rich`` table)."""
        from rich.table import Table

        level = f"{self.confidence:.0%}"
        table = Table(title=title or f"GREADTH per agent turn (share passing, {level} bootstrap interval)")
        table.add_column("agent")
        table.add_column("turns", justify="right")
        for metric in METRICS:
            table.add_column("GREADTH" if metric == "greadth" else SHORT_NAMES[metric], justify="right")
        table.add_column("invalid", justify="right")
        for agent in self.agents:
            turns = self._turns(agent)
            cells = [_pct(self.score(agent, m)) for m in METRICS]
            table.add_row(agent, str(len(turns)), *cells, str(sum(not t.valid for t in turns)))
        return table

    def behavior_table(self, title: str | None = None) -> Any:
        """Table 7: GREADTH per user behaviour (turns answering it, share passing, interval)."""
        from rich.table import Table

        level = f"{self.confidence:.0%}"
        table = Table(title=title or f"GREADTH per user behaviour (turns: share passing, {level} interval)")
        table.add_column("author of the last user message")
        for agent in self.agents:
            table.add_column(agent, justify="right")
        for behavior in [*self.behaviors(), None]:
            cells = []
            for agent in self.agents:
                n = len(self._turns(agent, behavior))
                cells.append(f"{n}: {_pct(self.score(agent, 'greadth', behavior))}" if n else "-")
            table.add_row(behavior or "ALL BEHAVIORS", *cells)
        return table

    def cost_table(self, title: str | None = None) -> Any:
        """Table 4: tokens per turn and dollars per million turns, per agent."""
        from rich.table import Table

        table = Table(title=title or "Cost per agent turn")
        if self.token_counting:
            table.caption = "tokens: " + "; ".join(f"{a}: {how}" for a, how in self.token_counting.items())
        for col in (
            "agent",
            "model",
            "LLM calls/turn",
            "prompt tok/turn",
            "completion tok/turn",
            "$ per 1M turns",
        ):
            table.add_column(col, justify="left" if col in ("agent", "model") else "right")
        for agent in self.agents:
            c = self.costs(agent)
            model = c["priced_as"] or ", ".join(c["models"]) or "-"
            if c["cost_per_turn"] is None:
                table.add_row(agent, model, *(["not measured"] * 4))
                continue
            table.add_row(
                agent,
                model,
                f"{c['llm_calls_per_turn']:.2f}",
                f"{c['prompt_tokens_per_turn']:,.0f}",
                f"{c['completion_tokens_per_turn']:,.0f}",
                f"{c['cost_per_million_turns']:,.2f}",
            )
        return table

    def pass_sources_table(self, title: str | None = None) -> Any:
        """Per agent and criterion, the passes a rule decided and those by default (no rule
        and no judge applied), and the GREADTH passes with at least one criterion by default."""
        from rich.table import Table

        table = Table(title=title or "What decided each pass: rule (or judge) / default (nothing decided it)")
        table.add_column("agent")
        table.add_column("turns", justify="right")
        for criterion in CRITERIA:
            table.add_column(SHORT_NAMES[criterion], justify="right")
        table.add_column("GREADTH passes (some default)", justify="right")
        for agent in self.agents:
            sources = self.pass_sources(agent)
            cells = []
            for criterion in CRITERIA:
                c = sources[criterion]
                decided = c["rule"] + c["judge"] + c["rule+judge"]
                cells.append(f"{decided} / {c['default']}")
            g = sources["greadth"]
            table.add_row(agent, str(len(self._turns(agent))), *cells, f"{g['passed']} ({g['some_default']})")
        return table

    def agreement_table(self, title: str | None = None) -> Any:
        """Per agent and criterion, the judge's agreement with the rules where both labelled."""
        from rich.table import Table

        table = Table(title=title or f"LLM judge ({self.judge_model or 'none'}) vs rules")
        for col in (
            "agent",
            "criterion",
            "both",
            "agree",
            "rule 1 judge 0",
            "rule 0 judge 1",
            "rate",
            "unparsable",
        ):
            table.add_column(col, justify="left" if col in ("agent", "criterion") else "right")
        for agent in self.agents:
            unparsable = self.judge_unparsable(agent)
            for criterion, a in self.agreement(agent).items():
                rate = f"{100 * a.rate:.1f}%" if a.rate is not None else "-"
                table.add_row(
                    agent,
                    SHORT_NAMES[criterion],
                    str(a.n),
                    str(a.agree),
                    str(a.rule_yes_judge_no),
                    str(a.rule_no_judge_yes),
                    rate,
                    str(unparsable[criterion]),
                )
        return table

    def tables(self) -> list[Any]:
        """The tables :meth:`to_text` prints: scores, what decided the passes, behaviours,
        costs, and agreement with a judge."""
        out = [self.table(), self.pass_sources_table(), self.behavior_table(), self.cost_table()]
        return [*out, self.agreement_table()] if self.judge_model is not None else out

    def to_text(self, width: int = 200) -> str:
        """Every table as plain text (no colours)."""
        import io

        from rich.console import Console

        console = Console(width=width, record=True, color_system=None, file=io.StringIO())
        for table in self.tables():
            console.print(table)
        return console.export_text()

    def print(self) -> None:
        """Print every table to the terminal."""
        from rich.console import Console

        console = Console()
        for table in self.tables():
            console.print(table)

    # ------------------------------------------------------------------ JSON

    def summary(self) -> dict[str, Any]:
        """The tables' figures as plain data, per agent."""
        out: dict[str, Any] = {}
        for agent in self.agents:
            out[agent] = {
                "turns": len(self._turns(agent)),
                "invalid": sum(not t.valid for t in self._turns(agent)),
                "scores": {m: self.score(agent, m).model_dump() for m in METRICS},
                "by_behavior": {
                    b: {
                        "turns": len(self._turns(agent, b)),
                        "greadth": self.score(agent, "greadth", b).model_dump(),
                    }
                    for b in self.behaviors()
                    if self._turns(agent, b)
                },
                "costs": self.costs(agent),
                "sources": self.sources(agent),
                "pass_sources": self.pass_sources(agent),
            }
            if self.judge_model is not None:
                out[agent]["agreement"] = {
                    c: {**a.model_dump(), "rate": a.rate} for c, a in self.agreement(agent).items()
                }
                out[agent]["judge_unparsable"] = self.judge_unparsable(agent)
        return out

    def summary_data(self) -> dict[str, Any]:
        """The tables' figures (:meth:`summary`), written under ``"summary"`` by :meth:`save`."""
        return self.summary()


def passes_rules(tape: Tape[Any, Any]) -> bool:
    """Whether every agent turn of ``tape`` is valid and fails no GREADTH rule (the rules
    only, no judge; a tape without agent turns passes)."""
    return all(t.valid and not t.failed_rules() for t in label_turns([tape]))


def _price_turn(
    labels: TurnLabels, calls: list[LLMCall], prices: dict[str, Price] | None, model: str | None
) -> None:
    labels.llm_calls = len(calls)
    labels.prompt_tokens = sum(c.prompt_tokens for c in calls)
    labels.completion_tokens = sum(c.output_tokens for c in calls)
    labels.models = sorted({c.model for c in calls})
    if prices is None:
        labels.cost = sum(c.cost for c in calls)
        return
    cost = 0.0
    for call in calls:
        name = model or call.model
        if name not in prices:
            raise ValueError(
                f"no price for model {name!r} (turn {labels.turn} of tape {labels.tape_id}); "
                f"prices has: {sorted(prices)} (or map the agent to a priced model with priced_as)"
            )
        cost += prices[name].cost(call.prompt_tokens, call.output_tokens)
    labels.cost = cost


def greadth_report(
    tapes_by_agent: Mapping[str, Iterable[Tape[Any, Any]]],
    judge: GreadthJudge | Any = None,
    prices: Mapping[str, Price | tuple[float, float]] | None = None,
    *,
    llm_calls: Any = None,
    priced_as: Mapping[str, str] | None = None,
    last_only: bool = False,
    seed: int = 0,
    n_bootstrap: int = 10_000,
    confidence: float = 0.95,
) -> GreadthReport:
    """Label every agent turn of every agent's tapes and gather the report (see the module doc)."""
    if not isinstance(tapes_by_agent, Mapping) or not tapes_by_agent:
        raise ValueError("tapes_by_agent must be a non-empty mapping {agent label: tapes}")
    checked = check_prices(prices) if prices is not None else None
    priced = dict(priced_as or {})
    unknown = [a for a in priced if a not in tapes_by_agent]
    if unknown:
        raise ValueError(f"priced_as names agents not in tapes_by_agent: {unknown}")
    for agent, model in priced.items():
        if checked is None or model not in checked:
            raise ValueError(f"priced_as[{agent!r}] = {model!r}, which is not in prices")
    the_judge = as_judge(judge)
    lookup = call_lookup(llm_calls) if llm_calls is not None else None
    report = GreadthReport(
        judge_model=the_judge.model if the_judge is not None else None,
        prices=checked,
        priced_as=priced,
        tokens_measured=lookup is not None,
        seed=seed,
        n_bootstrap=n_bootstrap,
        confidence=confidence,
    )
    for agent, tapes in tapes_by_agent.items():
        labelled = labelled_turns(tapes, the_judge, last_only)
        if lookup is not None:
            for labels, turn in labelled:
                _price_turn(labels, turn_calls(turn, lookup), checked, priced.get(agent))
        report.turns[agent] = [labels for labels, _ in labelled]
    return report
