"""The form-filling case study end to end (section 5 of the paper), in one command.

1. Forms and splits, fixed in code (:func:`make_splits`, names checked disjoint):
   **train** = the 3 bundled training companies plus, with ``--synthetic N`` (``--quick``: 40),
   N made-up ones (:func:`~examples.form_filler.synthetic.synthetic_companies`, seed 0, random
   form and slot names, so the student learns to copy names from its prompt rather than
   remember the training forms); **val** = 3 further made-up companies
   (``synthetic_companies(3, seed=VALIDATION_SEED)``, drawn first, so no training company uses
   their names or their forms' names), grown with their own tree seed; **test** = the 3 bundled
   test companies (scored in earlier runs, and ``--synthetic 40`` and beam 6 were chosen on
   them: no longer a clean test set); **fresh** = 3 made-up companies no run before issue 44
   scored (``synthetic_companies(3, seed=FRESH_SEED)``, avoiding every bundled, validation and
   the first 200 made-up training companies' form names, so they are the same whatever
   ``--synthetic``). ``--split val`` (the default) scores on the validation companies; a
   split's trees are grown only when it is scored (``--split test``, ``--split fresh``).
   Choose settings with ``val``; run ``fresh`` once, at the end.
2. Dialogue trees: the multi-node teacher talks with the 19 simulated user behaviours at every
   training company and every company of the scored split (beam search over behaviours and
   forms, at most 18 messages), through the batch runner into a SQLite store (rerunning with the
   same ``--out`` resumes).
3. Distillation: the training trees' teacher tapes -> ``student.reuse`` -> training samples
   (the student's tokenizer and chat template) -> SFT of the student's model. The tiny
   student's tokenizer is fitted on the training companies' forms only.
   ``--filter-tapes``: ``off`` (default) trains on every teacher tape; ``on`` trains on only the
   tapes whose every agent turn passes every GREADTH rule
   (:func:`~examples.form_filler.greadth.passes_rules`; with ``--error-rate`` > 0 the oracle
   slips and the rules drop those tapes); ``both`` trains two students from the same trees and
   the same base model, one on all tapes and one on the kept ones, and scores both on the same
   turns. Kept and dropped tape ids (with the failed rules) go to ``filter.json``.
4. GREADTH on the scored split: one agent turn continuing each of a set of partial dialogues
   taken from the split's trees (the same for every agent, every behaviour represented), for the
   teacher, the untrained student three ways (zero-shot; **zero-shot held to its output
   grammar**, the JSON list of steps each node may write as the prompt's response schema, so
   its answers always parse: :func:`~examples.form_filler.agents.output_schema`; **few-shot**,
   ``--shots K`` (default 2) worked examples per node from the training companies' teacher
   tapes, chosen deterministically and saved to ``few_shot.json``;
   ``--no-baselines`` leaves the last two out) and the tuned student(s); the GREADTH table, the
   table of what decided each pass (per criterion, the passes a rule decided and those counted
   as passed by default because no rule applied; and the GREADTH passes with at least one
   criterion by default), the per-behaviour table and the cost table (Table 4's prices: the
   teacher priced as Llama-3.1-405B, the students as Llama-3.1-8B) are printed and saved as
   ``greadth.json`` (with the split's name). The oracle teacher's tokens are counted by the
   embedded SmolLM2's tokenizer (chat template applied, as the student's are); if it cannot
   load they are estimated at 4 characters per token and the output says so
   (``stage=teacher_tokens``, a warning, ``token_counting`` in both JSON files).
5. Paired statistics on the same turns (:func:`paired_statistics`): tuned - each baseline,
   tuned - teacher and, with both students, filtered - unfiltered, on GREADTH and each
   criterion (mean difference with a paired bootstrap interval, exact McNemar p-value on
   GREADTH), the share of the gap to the teacher each tuned student closes from each baseline
   (bootstrap interval), and each student's cost ratio to the teacher with its token ratio and
   its price ratio apart, per turn and per passing turn; printed and saved as ``paired.json``.

Offline (default) the teacher's LLM is the programmatic :class:`~examples.form_filler.oracle.Oracle`
and the student a tiny model trained here (``--student tiny``, full fine-tuning) or the
embedded SmolLM2-135M (``--student smollm2``, LoRA). For real: ``--teacher-url URL
--teacher-model NAME`` (any OpenAI-compatible server) and ``--student-model PATH`` (a local
Hugging Face model to tune with LoRA); ``--user-url URL --user-model NAME`` has an LLM word the
simulated users' turns (:class:`~examples.form_filler.llm_user.LLMUser`; the behaviours'
programs still decide what each turn says), in every tree or, with ``--user-llm-on scored``,
only in the scored split's (the student learns from the programs' wording and is scored on the
LLM's). ``--tuned DIR`` scores an earlier run's student (its SFT output folder) instead of
training one: the same student on another split or with other users, without another SFT.

Run: ``python examples/form_filler/run.py --quick`` (validation split, < 10 minutes on 2 CPU
cores); ``--split fresh`` for the final, reported run (``--split test``: the bundled test
companies, scored before); ``--error-rate 0.2 --filter-tapes both`` for the filtered-tapes
comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.form_filler.agents import make_student, make_teacher
from examples.form_filler.costs import PAPER_PRICES
from examples.form_filler.distill import (
    StudentConfig,
    continue_branches,
    demos_by_node,
    few_shot_demos,
    reusable,
    student_llm,
    student_samples,
    tiny_student,
    tokenizer_texts,
    train_student,
    trainable,
)
from examples.form_filler.greadth import METRICS, GreadthReport, greadth_report, passes_rules
from examples.form_filler.greadth_labels import label_turns
from examples.form_filler.llm_user import LLMUser
from examples.form_filler.oracle import ESTIMATED, OracleLLM, smollm2_counter
from examples.form_filler.schema import Company, FormSet, check_form_set, load_form_set
from examples.form_filler.synthetic import synthetic_companies
from examples.form_filler.tree import Branch, TreeSettings, grow_tree
from tapekit import FunctionLLM

TEACHER, ZERO_SHOT, TUNED = "teacher", "student (zero-shot)", "student (tuned)"
FILTERED = "student (tuned, filtered tapes)"
GRAMMAR, FEW_SHOT = "student (zero-shot, grammar)", "student (few-shot)"
BASELINES = (ZERO_SHOT, GRAMMAR, FEW_SHOT)
"""The untrained students a tuned one is compared with (paired), in table order."""
SHORT = {TUNED: "tuned", FILTERED: "filtered"}
SPLITS = ("val", "test", "fresh")
FILTER_MODES = ("off", "on", "both")
VALIDATION_COMPANIES = 3
VALIDATION_SEED = 7
"""The validation companies: ``synthetic_companies(VALIDATION_COMPANIES, seed=VALIDATION_SEED)``."""
FRESH_COMPANIES = 3
FRESH_SEED = 44
"""The fresh test companies: ``synthetic_companies(FRESH_COMPANIES, seed=FRESH_SEED)`` (44: the
audit's issue; no other code draws with this seed), avoiding the forms of the bundled companies,
the validation companies and the first :data:`FRESH_AVOIDS` made-up training companies."""
FRESH_AVOIDS = 200
"""The fresh companies avoid the form names of this many made-up training companies, so they are
the same and disjoint from training for any ``--synthetic`` up to it (``check_disjoint`` checks
beyond)."""
USER_MAX_TOKENS = 96
"""The most tokens an LLM-played user's message may take (``--user-url``): a user's turn is a
sentence or two, and a small model left unbounded rambles on for hundreds."""


@dataclass
class Settings:
    """One run of the study; ``--quick`` picks the small numbers."""

    train_tree: TreeSettings = field(default_factory=lambda: TreeSettings(intents=20, beam_width=60))
    test_tree: TreeSettings = field(default_factory=lambda: TreeSettings(intents=10, beam_width=30, seed=1))
    val_tree: TreeSettings = field(default_factory=lambda: TreeSettings(intents=10, beam_width=30, seed=3))
    fresh_tree: TreeSettings = field(default_factory=lambda: TreeSettings(intents=10, beam_width=30, seed=5))
    split: str = "val"
    filter_tapes: str = "off"
    n_eval: int = 190
    synthetic: int = 0
    synthetic_tree: TreeSettings = field(
        default_factory=lambda: TreeSettings(intents=10, beam_width=6, seed=2)
    )
    student: StudentConfig = field(default_factory=StudentConfig)
    error_rate: float = 0.0
    teacher_url: str | None = None
    teacher_model: str | None = None
    student_model: str | None = None
    user_url: str | None = None
    user_model: str | None = None
    user_llm_on: str = "all"
    tuned: Path | None = None
    threads: int = 1
    baselines: bool = True
    shots: int = 2

    def scored_tree(self) -> TreeSettings:
        """The tree settings of the scored split's companies."""
        return {"val": self.val_tree, "test": self.test_tree, "fresh": self.fresh_tree}[self.split]


def _line(**items: Any) -> None:
    print(" ".join(f"{k}={v}" for k, v in items.items()), flush=True)


@dataclass
class Splits:
    """The companies of each split: ``train`` (bundled, then ``made_up``), ``val``, ``test``
    (the bundled test companies, scored before), ``fresh`` (made-up, nothing chosen on them)."""

    train: list[Company]
    val: list[Company]
    test: list[Company]
    made_up: list[Company] = field(default_factory=list)
    fresh: list[Company] = field(default_factory=list)

    def companies(self, split: str) -> list[Company]:
        """The companies of ``split`` (``train``, ``val``, ``test`` or ``fresh``)."""
        if split not in ("train", *SPLITS):
            raise ValueError(f"no split {split!r}; splits: train, {', '.join(SPLITS)}")
        return list(getattr(self, split))

    def catalog(self) -> FormSet:
        """Every company, for looking one up by name (``FormSet.company``)."""
        return FormSet(train=[*self.train, *self.val], test=[*self.test, *self.fresh])


def check_disjoint(splits: Splits) -> None:
    """``ValueError`` unless no company name and no form name is in two splits."""
    names = {s: {c.name for c in splits.companies(s)} for s in ("train", *SPLITS)}
    forms = {s: {f.name for c in splits.companies(s) for f in c.forms} for s in ("train", *SPLITS)}
    for i, a in enumerate(names):
        for b in list(names)[i + 1 :]:
            shared = (names[a] & names[b]) | (forms[a] & forms[b])
            if shared:
                raise ValueError(f"splits {a} and {b} share names: {sorted(shared)[:5]}")


def make_splits(forms: FormSet, synthetic: int, validation: int = VALIDATION_COMPANIES) -> Splits:
    """The study's splits (see the module doc): the validation companies are drawn first,
    avoiding the bundled forms' names; the made-up training companies then avoid theirs too
    (both as before the fresh split existed: the same companies); the fresh companies avoid the
    bundled, the validation and the first :data:`FRESH_AVOIDS` made-up training companies'
    forms (a made-up company list is a prefix of any longer one), so they do not depend on
    ``synthetic``. Every name is then checked (:func:`check_disjoint`)."""
    val = synthetic_companies(validation, seed=VALIDATION_SEED, avoid=forms)
    before = FormSet(train=[*forms.train, *val], test=forms.test)
    made_up = synthetic_companies(synthetic, avoid=before)
    avoided = synthetic_companies(FRESH_AVOIDS, avoid=before)
    fresh = synthetic_companies(
        FRESH_COMPANIES, seed=FRESH_SEED, avoid=FormSet(train=[*before.train, *avoided], test=forms.test)
    )
    splits = Splits(
        train=[*forms.train, *made_up], val=val, test=list(forms.test), made_up=made_up, fresh=fresh
    )
    check_disjoint(splits)
    return splits


@dataclass
class TapeFilter:
    """Training tapes split by :func:`filter_tapes`: ``kept`` pass every rule on every turn;
    ``dropped`` pairs each other tape with the names of the rules it failed."""

    kept: list[Any]
    dropped: list[tuple[Any, list[str]]]

    def to_json(self) -> dict[str, Any]:
        """Which tapes were kept and which dropped (with the failed rules), by tape id."""
        return {
            "kept": len(self.kept),
            "dropped": len(self.dropped),
            "kept_ids": [t.metadata.id for t in self.kept],
            "dropped_ids": {t.metadata.id: rules for t, rules in self.dropped},
        }


def filter_tapes(tapes: list[Any]) -> TapeFilter:
    """The tapes in which every agent turn passes every GREADTH rule (rules only, see
    :func:`~examples.form_filler.greadth.passes_rules`), and the others with why."""
    kept, dropped = [], []
    for tape in tapes:
        if passes_rules(tape):
            kept.append(tape)
            continue
        failed = {f.rule for t in label_turns([tape]) for f in t.failed_rules()}
        if not failed:  # an invalid turn that no named rule failed
            failed = {"invalid"}
        dropped.append((tape, sorted(failed)))
    return TapeFilter(kept, dropped)


def paired_statistics(report: GreadthReport) -> dict[str, Any]:
    """Paired comparisons among the report's agents on the same turns: each tuned student
    against each baseline (zero-shot, zero-shot under the output grammar, few-shot: those in
    the report) and the teacher, filtered against unfiltered when both are there, on each
    metric; the gap each tuned student closes between zero-shot and teacher (``gap_closed``) and
    between each baseline and the teacher (``gap_closed_from``); and each student's cost against
    the teacher's, its token and price ratios apart (``cost_ratios``, see
    :meth:`GreadthReport.cost_ratios`). ``pairs`` lists the compared ``(a, b)`` in table order."""
    agents = set(report.agents)
    tuned = [a for a in (TUNED, FILTERED) if a in agents]
    pairs = [(s, b) for s in tuned for b in (*BASELINES, TEACHER) if b in agents]
    if {TUNED, FILTERED} <= agents:
        pairs.append((FILTERED, TUNED))
    comparisons = [
        {"a": a, "b": b, "metrics": {m: report.paired(a, b, m).model_dump() for m in METRICS}}
        for a, b in pairs
    ]
    gaps = {
        s: {m: report.gap_closed(s, ZERO_SHOT, TEACHER, m).model_dump() for m in METRICS}
        for s in tuned
        if {ZERO_SHOT, TEACHER} <= agents
    }
    gaps_from = {
        s: {
            b: {m: report.gap_closed(s, b, TEACHER, m).model_dump() for m in METRICS}
            for b in BASELINES
            if b in agents
        }
        for s in tuned
        if TEACHER in agents
    }
    ratios = {a: report.cost_ratios(TEACHER, a) for a in report.agents if a != TEACHER and TEACHER in agents}
    return {
        "split": report.split,
        "confidence": report.confidence,
        "n_bootstrap": report.n_bootstrap,
        "seed": report.seed,
        "pairs": [list(p) for p in pairs],
        "comparisons": comparisons,
        "gap_closed": gaps,
        "gap_closed_from": gaps_from,
        "cost_ratios": ratios,
        "token_counting": dict(report.token_counting),
    }


def teacher_agent(settings: Settings, counter: Any = None) -> Any:
    """The teacher on the oracle (its tokens counted by ``counter``'s tokenizer, see
    :func:`~examples.form_filler.oracle.smollm2_counter`; None: estimated), or on the
    OpenAI-compatible model named on the command line (which reports its own tokens)."""
    if settings.teacher_url is None:
        return make_teacher(OracleLLM(error_rate=settings.error_rate, counter=counter))
    from tapekit.llm import OpenAICompatibleLLM

    llm = OpenAICompatibleLLM(
        model_name=settings.teacher_model or "default",
        base_url=settings.teacher_url,
        parameters={"temperature": 0.0},
    )
    return make_teacher(llm)


def user_llm(settings: Settings) -> LLMUser | None:
    """The LLM that words the users' turns (``--user-url``), or None: the programs do."""
    if settings.user_url is None:
        return None
    from tapekit.llm import OpenAICompatibleLLM

    llm = OpenAICompatibleLLM(
        model_name=settings.user_model or "default",
        base_url=settings.user_url,
        parameters={"temperature": 0.7, "max_tokens": USER_MAX_TOKENS},
    )
    return LLMUser(llm)


def grow_trees(
    teacher: Any,
    companies: list[Any],
    tree: TreeSettings,
    store: Any,
    name: str,
    users: LLMUser | None = None,
) -> list[Branch]:
    """Every branch of the trees of ``companies`` (``users``: see :func:`user_llm`)."""
    branches: list[Branch] = []
    for company in companies:
        branches += grow_tree(teacher, company, tree, store=store, name=name, user_llm=users).branches
    return branches


def eval_branches(branches: list[Branch], n: int) -> list[Branch]:
    """Up to ``n`` valid branches, the behaviours in turn (so each is equally represented
    where the tree allows), in a fixed order."""
    by_behavior: dict[str, list[Branch]] = {}
    for branch in branches:
        if branch.error is None:
            by_behavior.setdefault(branch.behavior, []).append(branch)
    chosen: list[Branch] = []
    depth = 0
    while len(chosen) < n and any(len(v) > depth for v in by_behavior.values()):
        for name in sorted(by_behavior):
            if len(by_behavior[name]) > depth and len(chosen) < n:
                chosen.append(by_behavior[name][depth])
        depth += 1
    return chosen


def students(
    settings: Settings, train_tapes: list[Any], forms: FormSet
) -> tuple[Any, Any, Any, list[Any], str | None]:
    """The student before training: its LLM, model, tokenizer, the tapes it can reuse, and the
    base model's path (to load a fresh copy for a second student). The tiny student's tokenizer
    learns from ``forms`` (pass the training companies only)."""
    config = settings.student
    if config.kind == "tiny":
        probe = make_student(FunctionLLM(fn=lambda prompt: "[]"))
        tapes = reusable(train_tapes, probe)
        model, tokenizer, base = tiny_student(config, tokenizer_texts(tapes, forms))
        return student_llm(config, str(base)), model, tokenizer, tapes, str(base)
    before = student_llm(config, settings.student_model)
    model, tokenizer = trainable(config, settings.student_model)
    return before, model, tokenizer, reusable(train_tapes, make_student(before)), settings.student_model


def tune(
    settings: Settings,
    config: StudentConfig,
    tapes: list[Any],
    student: tuple[Any, Any, Any],
    label: str,
) -> Any:
    """SFT of the ``student`` (its LLM before training, model and tokenizer) on ``tapes``
    (output under ``config.out``); the tuned student's LLM."""
    before, model, tokenizer = student
    rows = student_samples(tapes, make_student(before), tokenizer)
    longest = max(len(ids) for ids in rows["input_ids"])
    _line(
        stage="samples",
        student=SHORT[label],
        rows=len(rows),
        teacher_tapes=len(tapes),
        longest_tokens=longest,
    )
    if settings.tuned is not None:  # an earlier run's SFT output: no training here
        final = settings.tuned
        _line(stage="sft", student=SHORT[label], reused=final)
    else:
        final, seconds = train_student(config, rows, model, tokenizer)
        _line(stage="sft", student=SHORT[label], steps=config.steps, train_seconds=f"{seconds:.0f}")
    if config.kind == "tiny":
        return student_llm(config, str(final))
    return student_llm(config, settings.student_model, str(final))


def run_baselines(
    settings: Settings, before: Any, tapes: list[Any], chosen: list[Branch], splits: Splits, store: Any
) -> dict[str, list[Any]]:
    """The untrained student's two fairer baselines on the same partial dialogues: decoding held
    to its output grammar (``GRAMMAR``: the JSON list of steps each node may write, as the
    prompt's response schema; :func:`~examples.form_filler.agents.output_schema`), and
    ``settings.shots`` worked examples per node from the training tapes ``tapes`` in its prompt
    (``FEW_SHOT``; :func:`~examples.form_filler.distill.few_shot_demos`, saved to
    ``few_shot.json``). Their continued tapes by label."""
    out: dict[str, list[Any]] = {}
    started = time.perf_counter()
    agent = make_student(before, constrain=True)
    out[GRAMMAR] = continue_branches(agent, chosen, splits.catalog(), store, "eval-zero-shot-grammar")
    _line(
        stage="zero_shot_grammar",
        split=settings.split,
        continuations=len(out[GRAMMAR]),
        seconds=f"{time.perf_counter() - started:.0f}",
    )
    if settings.shots < 1:
        return out
    demos = few_shot_demos(tapes, settings.shots)
    (settings.student.out / "few_shot.json").write_text(
        json.dumps(
            {
                "k": settings.shots,
                "demos": [d.__dict__ for d in demos],
                "train_companies": len(splits.train),
            },
            indent=2,
        )
    )
    started = time.perf_counter()
    agent = make_student(before, demos=demos_by_node(demos))
    out[FEW_SHOT] = continue_branches(agent, chosen, splits.catalog(), store, "eval-few-shot")
    _line(
        stage="few_shot",
        split=settings.split,
        k=settings.shots,
        demos=len(demos),
        continuations=len(out[FEW_SHOT]),
        seconds=f"{time.perf_counter() - started:.0f}",
    )
    return out


def run(settings: Settings) -> GreadthReport:
    """The whole study; prints a line per stage and returns the GREADTH report (its paired
    statistics are printed and saved as ``paired.json``)."""
    import torch
    import transformers

    from tapekit import open_store

    if settings.split not in SPLITS or settings.filter_tapes not in FILTER_MODES:
        raise ValueError(f"split must be one of {SPLITS} and filter_tapes one of {FILTER_MODES}")
    torch.set_num_threads(settings.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    out = settings.student.out
    out.mkdir(parents=True, exist_ok=True)
    forms = load_form_set()
    problems = check_form_set(forms, forms_per_company=10, all_kinds=True)
    if problems:
        raise ValueError(f"the bundled forms are invalid: {problems[:3]}")
    splits = make_splits(forms, settings.synthetic)
    split = settings.split
    _line(
        stage="forms",
        split=split,
        train=len(forms.train),
        synthetic=len(splits.made_up),
        val=len(splits.val),
        test=len(splits.test),
        fresh=len(splits.fresh),
        forms_per_company=10,
    )
    store = open_store(str(out / "tapes.db"))

    counter, counting = (None, "reported by the server") if settings.teacher_url else smollm2_counter()
    _line(stage="teacher_tokens", how=json.dumps(counting))
    if counting.startswith(ESTIMATED):
        print(f"warning: the teacher's tokens are {counting}", file=sys.stderr, flush=True)
    teacher, users = teacher_agent(settings, counter), user_llm(settings)
    # --user-llm-on scored: the LLM words only the scored split's users; training stays templated
    train_users = users if settings.user_llm_on == "all" else None
    if users is not None:
        _line(stage="users", worded_by=settings.user_model or "default", on=settings.user_llm_on)
    started = time.perf_counter()
    train = grow_trees(teacher, forms.train, settings.train_tree, store, "train-tree", train_users)
    # only the scored split's companies are grown (the others' dialogues are never made)
    scored = grow_trees(
        teacher, splits.companies(split), settings.scored_tree(), store, f"{split}-tree", users
    )
    if splits.made_up:
        train += grow_trees(
            teacher, splits.made_up, settings.synthetic_tree, store, "synthetic-tree", train_users
        )
    behaviors = {b.behavior for b in train} & {b.behavior for b in scored}
    _line(
        stage="trees",
        split=split,
        train_branches=len(train),
        eval_branches=len(scored),
        behaviours_in_both=len(behaviors),
        synthetic_companies=len(splits.made_up),
        seconds=f"{time.perf_counter() - started:.0f}",
    )
    chosen = eval_branches(scored, settings.n_eval)
    teacher_tapes = [b.tape for b in chosen]
    train_tapes = [b.tape for b in train if b.error is None]

    tokenizer_forms = FormSet(train=splits.train, test=[])
    before, model, tokenizer, tapes, base = students(settings, train_tapes, tokenizer_forms)
    # the students to tune: (label, training tapes, where their SFT output goes)
    variants: list[tuple[str, list[Any], StudentConfig]] = []
    if settings.filter_tapes != "on":
        variants.append((TUNED, tapes, settings.student))
    if settings.filter_tapes != "off":
        kept = filter_tapes(train_tapes)
        _line(
            stage="filter",
            error_rate=settings.error_rate,
            tapes=len(train_tapes),
            kept=len(kept.kept),
            dropped=len(kept.dropped),
        )
        (out / "filter.json").write_text(
            json.dumps({"split": split, "error_rate": settings.error_rate, **kept.to_json()}, indent=2)
        )
        ids = {t.metadata.id for t in kept.kept}
        filtered = [t for t in tapes if t.metadata.id in ids]
        if not filtered:
            raise ValueError("--filter-tapes kept no training tape the student can reuse")
        variants.append((FILTERED, filtered, replace(settings.student, out=out / "filtered")))

    started = time.perf_counter()
    zero = continue_branches(make_student(before), chosen, splits.catalog(), store, "eval-zero-shot")
    _line(
        stage="zero_shot",
        split=split,
        continuations=len(zero),
        seconds=f"{time.perf_counter() - started:.0f}",
    )
    baselines: dict[str, list[Any]] = {ZERO_SHOT: zero}
    if settings.baselines:
        baselines.update(run_baselines(settings, before, tapes, chosen, splits, store))

    continued: dict[str, list[Any]] = {}
    for i, (label, variant_tapes, config) in enumerate(variants):
        if i:  # a second student starts from the same base model, freshly loaded
            model, _ = trainable(config, base)
        after = tune(settings, config, variant_tapes, (before, model, tokenizer), label)
        started = time.perf_counter()
        name = f"eval-{SHORT[label]}"
        continued[label] = continue_branches(make_student(after), chosen, splits.catalog(), store, name)
        _line(
            stage="tuned",
            student=SHORT[label],
            split=split,
            continuations=len(continued[label]),
            seconds=f"{time.perf_counter() - started:.0f}",
        )

    big, small = "Llama-3.1-405B-Instruct", "Llama-3.1-8B-Instruct"
    agents = {TEACHER: teacher_tapes, **baselines, **continued}
    report = greadth_report(
        agents,
        prices=PAPER_PRICES,
        priced_as={a: big if a == TEACHER else small for a in agents},
        llm_calls=store,
        last_only=True,
    )
    report.split = split
    report.token_counting = {TEACHER: counting} | {
        a: "counted by the student's own tokenizer" for a in agents if a != TEACHER
    }
    report.save(out / "greadth.json")
    paired = paired_statistics(report)
    (out / "paired.json").write_text(json.dumps(paired, indent=2))
    store.close()
    return report


def parse_args(argv: list[str] | None = None) -> Settings:
    """Settings from the command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small trees and training (< 10 minutes)")
    parser.add_argument("--student", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--steps", type=int, help="SFT optimiser steps")
    parser.add_argument("--layers", type=int, help="tiny student: layers")
    parser.add_argument("--hidden", type=int, help="tiny student: hidden size")
    parser.add_argument("--lr", type=float, help="learning rate")
    parser.add_argument("--batch-size", type=int, help="samples per SFT step")
    parser.add_argument("--synthetic", type=int, help="made-up training companies added to the bundled 3")
    parser.add_argument("--vocab", type=int, help="tiny student: tokenizer vocabulary size")
    parser.add_argument("--eval", type=int, help="partial dialogues of the scored split to continue")
    parser.add_argument(
        "--split",
        choices=SPLITS,
        default="val",
        help=(
            "the split scored: val (made-up validation companies), test (the bundled test companies, "
            "scored before and settings chosen on them) or fresh (made-up companies nothing was chosen on)"
        ),
    )
    parser.add_argument(
        "--filter-tapes",
        choices=FILTER_MODES,
        default="off",
        help="train on all teacher tapes (off), only those passing every GREADTH rule (on), or both students",
    )
    parser.add_argument(
        "--no-baselines",
        action="store_true",
        help="score only the plain zero-shot student, not also the grammar-held and few-shot ones",
    )
    parser.add_argument("--shots", type=int, default=2, help="few-shot baseline: worked examples per node")
    parser.add_argument("--beam", type=int, help="beam width of the training trees")
    parser.add_argument("--error-rate", type=float, default=0.0, help="the oracle teacher's deliberate slips")
    parser.add_argument("--out", type=Path, default=Path("form-filler-out"), help="output directory")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on a busy CPU)")
    parser.add_argument("--teacher-url", help="an OpenAI-compatible endpoint for the teacher")
    parser.add_argument("--teacher-model", help="the teacher's model name at --teacher-url")
    parser.add_argument("--student-model", help="a local Hugging Face model for the student (LoRA)")
    parser.add_argument("--user-url", help="an OpenAI-compatible endpoint whose LLM words the users' turns")
    parser.add_argument("--user-model", help="the users' model name at --user-url")
    parser.add_argument(
        "--user-llm-on",
        choices=["all", "scored"],
        default="all",
        help="with --user-url: the LLM words every tree's users (all) or only the scored split's (scored)",
    )
    parser.add_argument(
        "--tuned",
        type=Path,
        help=(
            "an earlier run's SFT output with the same settings (SmolLM2: its LoRA adapter folder; "
            "tiny: its model folder): score it instead of training"
        ),
    )
    args = parser.parse_args(argv)
    settings = Settings(
        error_rate=args.error_rate, threads=args.threads, baselines=not args.no_baselines, shots=args.shots
    )
    settings.split, settings.filter_tapes = args.split, args.filter_tapes
    settings.teacher_url, settings.teacher_model = args.teacher_url, args.teacher_model
    settings.student_model = args.student_model
    settings.user_url, settings.user_model = args.user_url, args.user_model
    if args.user_model and not args.user_url:
        parser.error("--user-model needs --user-url")
    if args.user_llm_on != "all" and not args.user_url:
        parser.error("--user-llm-on needs --user-url")
    settings.user_llm_on = args.user_llm_on
    if args.tuned is not None:
        if args.filter_tapes != "off":
            parser.error("--tuned scores one student: it cannot stand for two (--filter-tapes)")
        if not (args.tuned / "config.json").is_file() and not (args.tuned / "adapter_config.json").is_file():
            parser.error(f"--tuned {args.tuned}: no config.json or adapter_config.json there")
        settings.tuned = args.tuned
    kind = "smollm2" if args.student_model or args.student == "smollm2" else "tiny"
    settings.student = StudentConfig(kind=kind, out=args.out)
    if kind != "tiny":
        settings.student.learning_rate, settings.student.batch_size = 2e-4, 4
        settings.student.max_length, settings.student.max_tokens = 2048, 256
        settings.student.dtype = "auto"  # bf16 autocast where the CPU has bf16 instructions, else fp32
    if args.quick:
        settings.train_tree = TreeSettings(intents=10, beam_width=20)
        settings.test_tree = TreeSettings(intents=10, beam_width=10, seed=1)
        settings.val_tree = TreeSettings(intents=10, beam_width=10, seed=3)
        settings.fresh_tree = TreeSettings(intents=10, beam_width=10, seed=5)
        settings.n_eval = 38
        settings.student.steps = 500 if kind == "tiny" else 360  # smollm2, on val: 120 7.9 %, 360 71.1 %
        settings.synthetic = 40
        if kind == "tiny":  # smaller pieces of names (copied, not remembered), longer rows
            settings.student.vocab, settings.student.max_length = 1024, 640
    if args.steps is not None:
        settings.student.steps = args.steps
    if args.synthetic is not None:
        settings.synthetic = args.synthetic
    tiny_options = (("layers", args.layers), ("hidden", args.hidden), ("vocab", args.vocab))
    for name, value in (*tiny_options, ("learning_rate", args.lr)):
        if value is not None:
            setattr(settings.student, name, value)
    if args.batch_size is not None:
        settings.student.batch_size = args.batch_size
    if args.eval is not None:
        settings.n_eval = args.eval
    if args.beam is not None:
        settings.train_tree = TreeSettings(intents=settings.train_tree.intents, beam_width=args.beam)
    if settings.student.steps < 1 or settings.n_eval < 1:
        parser.error("--steps and --eval must be at least 1")
    if settings.shots < 0:
        parser.error("--shots must be at least 0 (0: no few-shot baseline)")
    return settings


def _ratios_line(ratios: dict[str, Any]) -> str:
    """One line: per turn and per passing turn, the token, price and cost ratios."""

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}x"

    parts = []
    for scope in ("per_turn", "per_passing_turn"):
        r = ratios.get(scope)
        if r is None:
            parts.append(f"{scope}: -")
            continue
        tokens, price, cost = (fmt(r[k]) for k in ("token_ratio", "price_ratio", "cost_ratio"))
        parts.append(f"{scope}: tokens {tokens} x price {price} = cost {cost}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Run the study and print the GREADTH, cost and paired-difference tables."""
    from rich.console import Console

    settings = parse_args(argv)
    started = time.perf_counter()
    report = run(settings)
    report.print()
    pairs = [tuple(p) for p in paired_statistics(report)["pairs"]]
    if pairs:
        Console().print(report.paired_table(pairs))
    for student in (TUNED, FILTERED):
        if student in report.agents:
            for baseline in (b for b in BASELINES if b in report.agents):
                gap = report.gap_closed(student, baseline, TEACHER)
                print(f"gap_closed[{student} from {baseline}]={gap}")
    for agent, ratios in paired_statistics(report)["cost_ratios"].items():
        print(f"cost_ratios[teacher / {agent}]={_ratios_line(ratios)}")
    print(f"tokens: {json.dumps(report.token_counting)}")
    summary = {agent: round(report.score(agent).value, 3) for agent in report.agents}
    print(f"split={report.split} greadth=" + json.dumps(summary))
    print(f"total_seconds={time.perf_counter() - started:.0f} out={settings.student.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
