"""The form-filling case study end to end (section 5 of the paper), in one command.

1. Forms: the bundled companies (3 training, 3 test, 10 forms each), checked; with
   ``--synthetic N`` (``--quick``: 40) also N made-up training companies
   (:func:`~examples.form_filler.synthetic.synthetic_companies`, random form and slot names, so
   the student learns to copy names from its prompt rather than remember the training forms).
2. Dialogue trees: the multi-node teacher talks with the 19 simulated user behaviours at every
   company (beam search over behaviours and forms, at most 18 messages), through the batch
   runner into a SQLite store (rerunning with the same ``--out`` resumes).
3. Distillation: the training trees' teacher tapes -> ``student.reuse`` -> training samples
   (the student's tokenizer and chat template) -> SFT of the student's model.
4. GREADTH on the test companies: one agent turn continuing each of a set of partial dialogues
   taken from the test trees (the same for every agent, every behaviour represented), for the
   teacher, the zero-shot student and the tuned student; the GREADTH table, the per-behaviour
   table and the cost table (Table 4's prices: the teacher priced as Llama-3.1-405B, the
   student as Llama-3.1-8B) are printed and saved as JSON.

Offline (default) the teacher's LLM is the programmatic :class:`~examples.form_filler.oracle.Oracle`
and the student a tiny model trained here (``--student tiny``, full fine-tuning) or the
embedded SmolLM2-135M (``--student smollm2``, LoRA). For real: ``--teacher-url URL
--teacher-model NAME`` (any OpenAI-compatible server) and ``--student-model PATH`` (a local
Hugging Face model to tune with LoRA); ``--user-url URL --user-model NAME`` has an LLM word the
simulated users' turns (:class:`~examples.form_filler.llm_user.LLMUser`; the behaviours'
programs still decide what each turn says).

Run: ``python examples/form_filler/run.py --quick`` (< 10 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.form_filler.agents import make_student, make_teacher
from examples.form_filler.costs import PAPER_PRICES
from examples.form_filler.distill import (
    StudentConfig,
    continue_branches,
    reusable,
    student_llm,
    student_samples,
    tiny_student,
    tokenizer_texts,
    train_student,
)
from examples.form_filler.greadth import GreadthReport, greadth_report
from examples.form_filler.llm_user import LLMUser
from examples.form_filler.oracle import OracleLLM
from examples.form_filler.schema import FormSet, check_form_set, load_form_set
from examples.form_filler.synthetic import synthetic_companies
from examples.form_filler.tree import Branch, TreeSettings, grow_tree
from tapekit import FunctionLLM

TEACHER, ZERO_SHOT, TUNED = "teacher", "student (zero-shot)", "student (tuned)"


@dataclass
class Settings:
    """One run of the study; ``--quick`` picks the small numbers."""

    train_tree: TreeSettings = field(default_factory=lambda: TreeSettings(intents=20, beam_width=60))
    test_tree: TreeSettings = field(default_factory=lambda: TreeSettings(intents=10, beam_width=30, seed=1))
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
    threads: int = 1


def _line(**items: Any) -> None:
    print(" ".join(f"{k}={v}" for k, v in items.items()), flush=True)


def teacher_agent(settings: Settings) -> Any:
    """The teacher on the oracle, or on the OpenAI-compatible model named on the command line."""
    if settings.teacher_url is None:
        return make_teacher(OracleLLM(error_rate=settings.error_rate))
    from tapekit.llm.openai_compat import OpenAICompatibleLLM

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
    from tapekit.llm.openai_compat import OpenAICompatibleLLM

    llm = OpenAICompatibleLLM(
        model_name=settings.user_model or "default",
        base_url=settings.user_url,
        parameters={"temperature": 0.7},
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


def students(settings: Settings, train_tapes: list[Any], forms: FormSet) -> tuple[Any, Any, Any, Any]:
    """The student before training: its LLM, model, tokenizer, and the tapes it can reuse."""
    config = settings.student
    if config.kind == "tiny":
        probe = make_student(FunctionLLM(fn=lambda prompt: "[]"))
        tapes = reusable(train_tapes, probe)
        model, tokenizer, base = tiny_student(config, tokenizer_texts(tapes, forms))
        return student_llm(config, str(base)), model, tokenizer, tapes
    before = student_llm(config, settings.student_model)
    model, tokenizer = before.load()
    if getattr(model, "hf_quantizer", None) is not None:  # dequantized GGUF: trainable after all
        model.hf_quantizer.remove_quantization_config(model)
    return before, model, tokenizer, reusable(train_tapes, make_student(before))


def run(settings: Settings) -> GreadthReport:
    """The whole study; prints a line per stage and returns the GREADTH report."""
    import torch
    import transformers

    from tapekit import open_store

    torch.set_num_threads(settings.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    out = settings.student.out
    out.mkdir(parents=True, exist_ok=True)
    store = open_store(str(out / "tapes.db"))
    forms = load_form_set()
    problems = check_form_set(forms, forms_per_company=10, all_kinds=True)
    if problems:
        raise ValueError(f"the bundled forms are invalid: {problems[:3]}")
    _line(stage="forms", train=len(forms.train), test=len(forms.test), forms_per_company=10)

    teacher, users = teacher_agent(settings), user_llm(settings)
    started = time.perf_counter()
    train = grow_trees(teacher, forms.train, settings.train_tree, store, "train-tree", users)
    test = grow_trees(teacher, forms.test, settings.test_tree, store, "test-tree", users)
    if settings.synthetic:
        made_up = synthetic_companies(settings.synthetic, avoid=forms)
        train += grow_trees(teacher, made_up, settings.synthetic_tree, store, "synthetic-tree", users)
    behaviors = {b.behavior for b in train} & {b.behavior for b in test}
    _line(
        stage="trees",
        train_branches=len(train),
        test_branches=len(test),
        behaviours_in_both=len(behaviors),
        synthetic_companies=settings.synthetic,
        seconds=f"{time.perf_counter() - started:.0f}",
    )
    chosen = eval_branches(test, settings.n_eval)
    teacher_tapes = [b.tape for b in chosen]

    before, model, tokenizer, tapes = students(settings, [b.tape for b in train if b.error is None], forms)
    started = time.perf_counter()
    zero = continue_branches(make_student(before), chosen, forms, store, "eval-zero-shot")
    _line(stage="zero_shot", continuations=len(zero), seconds=f"{time.perf_counter() - started:.0f}")

    rows = student_samples(tapes, make_student(before), tokenizer)
    longest = max(len(ids) for ids in rows["input_ids"])
    _line(stage="samples", rows=len(rows), teacher_tapes=len(tapes), longest_tokens=longest)
    final, seconds = train_student(settings.student, rows, model, tokenizer)
    if settings.student.kind == "tiny":
        after = student_llm(settings.student, str(final))
    else:
        after = student_llm(settings.student, settings.student_model, str(final))
    _line(stage="sft", steps=settings.student.steps, train_seconds=f"{seconds:.0f}")
    started = time.perf_counter()
    tuned = continue_branches(make_student(after), chosen, forms, store, "eval-tuned")
    _line(stage="tuned", continuations=len(tuned), seconds=f"{time.perf_counter() - started:.0f}")

    big, small = "Llama-3.1-405B-Instruct", "Llama-3.1-8B-Instruct"
    report = greadth_report(
        {TEACHER: teacher_tapes, ZERO_SHOT: zero, TUNED: tuned},
        prices=PAPER_PRICES,
        priced_as={TEACHER: big, ZERO_SHOT: small, TUNED: small},
        llm_calls=store,
        last_only=True,
    )
    report.save(out / "greadth.json")
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
    parser.add_argument("--eval", type=int, help="partial test dialogues to continue")
    parser.add_argument("--beam", type=int, help="beam width of the training trees")
    parser.add_argument("--error-rate", type=float, default=0.0, help="the oracle teacher's deliberate slips")
    parser.add_argument("--out", type=Path, default=Path("form-filler-out"), help="output directory")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on a busy CPU)")
    parser.add_argument("--teacher-url", help="an OpenAI-compatible endpoint for the teacher")
    parser.add_argument("--teacher-model", help="the teacher's model name at --teacher-url")
    parser.add_argument("--student-model", help="a local Hugging Face model for the student (LoRA)")
    parser.add_argument("--user-url", help="an OpenAI-compatible endpoint whose LLM words the users' turns")
    parser.add_argument("--user-model", help="the users' model name at --user-url")
    args = parser.parse_args(argv)
    settings = Settings(error_rate=args.error_rate, threads=args.threads)
    settings.teacher_url, settings.teacher_model = args.teacher_url, args.teacher_model
    settings.student_model = args.student_model
    settings.user_url, settings.user_model = args.user_url, args.user_model
    if args.user_model and not args.user_url:
        parser.error("--user-model needs --user-url")
    kind = "smollm2" if args.student_model or args.student == "smollm2" else "tiny"
    settings.student = StudentConfig(kind=kind, out=args.out)
    if kind != "tiny":
        settings.student.learning_rate, settings.student.batch_size = 2e-4, 4
        settings.student.max_length, settings.student.max_tokens = 2048, 256
    if args.quick:
        settings.train_tree = TreeSettings(intents=10, beam_width=20)
        settings.test_tree = TreeSettings(intents=10, beam_width=10, seed=1)
        settings.n_eval = 38
        settings.student.steps = 500 if kind == "tiny" else 40
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
    return settings


def main(argv: list[str] | None = None) -> int:
    """Run the study and print the GREADTH and cost tables."""
    settings = parse_args(argv)
    started = time.perf_counter()
    report = run(settings)
    report.print()
    summary = {agent: round(report.score(agent).value, 3) for agent in report.agents}
    print("greadth=" + json.dumps(summary))
    print(f"total_seconds={time.perf_counter() - started:.0f} out={settings.student.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
