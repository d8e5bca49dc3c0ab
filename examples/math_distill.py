"""The paper's math distillation (section 4.4) in small, offline: teacher tapes -> a student that learns.

1. Arithmetic word problems in three difficulty levels are generated from a seed
   (``examples/math_study/problems.py``), split into training, validation and test problems
   (no validation or test problem has a training problem's arithmetic, and no test problem a
   validation problem's).
2. A multi-node teacher (plan -> act, calling a calculator tool over several turns -> answer)
   solves the training problems through the batch runner; its tapes go to a SQLite store. The
   teacher is a programmatic oracle LLM (offline) or any OpenAI-compatible model
   (``--teacher-url URL --teacher-model NAME``); only its correct tapes are kept.
3. The single-node student adapts each teacher tape with ``student.reuse(tape)``: the same steps
   as if the student had made them, one student turn per calculator call.
4. Token-exact training samples are made from those tapes with the student's own chat template
   (loss only on what the student writes), and the student is fine-tuned (SFT).
5. The student is evaluated on the validation problems before and after, strict (``Answer: N``
   exactly right) and lenient (the right number written anywhere), with ``tapekit.evaluate``:
   pass@1 with its 95 % bootstrap interval. Every setting is chosen on the validation split;
   ``--split test`` also evaluates the final student, once, on the untouched test split.

Students: ``--student tiny`` (default) is a tiny Llama-architecture model whose tokenizer is
trained here on the teacher's conversations (``tapekit.testing.tiny``), fully fine-tuned;
``--student smollm2`` is the embedded SmolLM2-135M-Instruct with LoRA.

Each stage prints one line (``stage=sft student=tiny split=val n=150 exact=0.84
exact_95ci=[0.78,0.90] ...``), then a table. ``--quick`` uses fewer problems and steps (CI);
on its 45 validation problems the interval is about +-14 points wide.

Run: ``python examples/math_distill.py [--quick] [--student tiny|smollm2] [--split val|test] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.math_study.agents import (
    SHORT_SYSTEM,
    STUDENT_SYSTEM,
    Oracle,
    calculator_environment,
    make_student,
    make_teacher,
    start_tape,
    student_messages,
)
from examples.math_study.problems import LEVELS, Splits, split_problems
from examples.math_study.rl_stage import ARMS
from examples.math_study.scoring import MAX_LOOPS, evaluate_agent, pass_at_1_text, strict, tasks_for
from tapekit import FunctionLLM, Tape
from tapekit.batch import batch
from tapekit.evaluate import EvalReport, Task


@dataclass
class Settings:
    """What one run does; ``--quick`` picks smaller numbers."""

    student: str = "tiny"
    rl: bool = True  # the RL stage after SFT (tiny student; off in --quick unless --rl)
    rl_seconds: float = 300.0
    rl_curriculum: str = "sec"
    rl_arms: str = "levels"  # the curriculum's arms: "levels" or "sizes" (examples.math_study.rl_stage)
    n_train: int = 6000
    n_val: int = 150  # every stage is evaluated on these
    n_test: int = 150  # with split="test", the final student is also evaluated on these, once
    split: str = "val"  # "test": evaluate the final student on the test split too
    steps: int = 1000
    batch_size: int = 16
    # training problems per level (validation and test ones are spread evenly): level1 is learned early,
    # so most samples go to the longer problems
    train_weights: dict[str, int] | None = field(
        default_factory=lambda: {"level1": 1, "level2": 2, "level3": 3}
    )
    learning_rate: float = 5e-3
    seed: int = 0
    out: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="math-distill-")))
    teacher_url: str | None = None
    teacher_model: str | None = None
    threads: int | None = 1  # measured: on 2 shared cores one torch thread steps faster than two
    hidden: int = 128
    packing: bool = False  # measured: on CPU, padded batches of 8 learned faster than packed rows
    max_length: int = 1024
    layers: int = 2
    heads: int = 8
    whole_numbers: int = 2000  # tiny student: each integer 10..N-1 one token; 0 = one per digit
    lr_scheduler: str = "linear"
    warmup_ratio: float = 0.05


@dataclass
class StageResult:
    """One printed line and one table row."""

    stage: str
    who: str
    report: EvalReport
    train_seconds: float = 0.0
    # the student this stage evaluated, as ``student_llm(settings, model_path, adapter_path)``
    # loads it (a later stage, e.g. RL, continues from the SFT stage's)
    model_path: str | None = None
    adapter_path: str | None = None
    split: str = "val"  # the problems ``report`` was measured on: "val" or "test"

    def record(self) -> dict[str, Any]:
        """What ``results.json`` keeps of the stage: the split, its size, pass@1 with intervals."""
        return {
            "stage": self.stage,
            "model": self.who,
            "split": self.split,
            "n": self.report.n_tasks,
            **{name: self.report.pass_at_1(name).model_dump() for name in ("strict", "lenient")},
            "train_seconds": round(self.train_seconds, 1),
        }

    def line(self) -> str:
        """``stage=... student=... split=val n=... exact=... exact_95ci=[..,..] lenient=...
        lenient_95ci=[..,..] tokens_per_task=... train_seconds=...``"""
        key = "teacher" if self.stage == "teacher" else "student"
        return (
            f"stage={self.stage} {key}={self.who} split={self.split} "
            f"{pass_at_1_text(self.report)} "
            f"tokens_per_task={self.report.tokens_per_attempt:.0f} "
            f"train_seconds={self.train_seconds:.0f}"
        )


# ----------------------------------------------------------------------------- stages


def teacher_llm(settings: Settings, oracle: Oracle) -> Any:
    """The oracle, or the OpenAI-compatible model named on the command line."""
    if settings.teacher_url is None:
        return FunctionLLM(model_name="oracle", fn=oracle, stream_chunks=False)
    from tapekit.llm import OpenAICompatibleLLM

    return OpenAICompatibleLLM(
        model_name=settings.teacher_model or "default",
        base_url=settings.teacher_url,
        parameters={"temperature": 0.0},
    )


def teach(teacher: Any, problems: list[Any], store: Any) -> list[Tape[Any, Any]]:
    """The teacher's tapes on the training problems (stored), keeping the correct ones."""
    results = batch(
        teacher,
        calculator_environment(),
        [start_tape(p) for p in problems],
        store=store,
        name="teacher-train",
        max_loops=MAX_LOOPS,
        max_concurrency=16,
    )
    good = []
    for result, task in zip(results, tasks_for(problems), strict=True):
        if result.ok and strict(result.tape, task).passed:
            good.append(result.tape)
    return good


def adapt(student: Any, tapes: list[Tape[Any, Any]]) -> tuple[list[Tape[Any, Any]], list[Tape[Any, Any]]]:
    """The teacher tapes the student can reuse, and their adapted versions (``student.reuse``);
    the others (e.g. a real teacher's tool call the student's text format cannot write) are
    skipped and counted."""
    from tapekit import ReconstructionError

    kept, adapted = [], []
    for tape in tapes:
        try:
            adapted.append(student.reuse(tape)[0])
            kept.append(tape)
        except (ReconstructionError, ValueError):
            pass
    if len(kept) < len(tapes):
        print(f"note: {len(tapes) - len(kept)} teacher tapes could not be adapted to the student: skipped")
    return kept, adapted


def run_eval(agent: Any, tasks: list[Task], store: Any, name: str) -> EvalReport:
    """Strict and lenient scores on ``tasks`` (greedy, one attempt per problem)."""
    return evaluate_agent(agent, tasks, store, name, max_concurrency=4)


def tokenizer_texts(tapes: list[Tape[Any, Any]], system: str = SHORT_SYSTEM) -> list[str]:
    """What the tiny tokenizer is trained on: the student's conversations, every message as
    the chat template writes it (role line, ``[tool result]`` prefix), so the template's
    recurring words become single tokens (shorter samples, faster steps)."""
    from tapekit.llm import plain_messages

    texts = []
    for tape in tapes:
        for m in plain_messages(student_messages(tape, system)):
            texts.append(f"{m['role']}\n{m['content']}")
    return texts


def student_system(settings: Settings) -> str:
    """The student's system message: the tiny student learns the format from its samples and
    gets a one-line one; SmolLM2 gets the instructions (it is evaluated zero-shot first)."""
    return SHORT_SYSTEM if settings.student == "tiny" else STUDENT_SYSTEM


def student_agent(settings: Settings, llm: Any) -> Any:
    """The single-node student on ``llm`` with this run's system message."""
    return make_student(llm, student_system(settings))


def make_samples(teacher_tapes: list[Tape[Any, Any]], student: Any, tokenizer: Any) -> Any:
    """Training samples (the training schema) of the student, from the teacher's tapes: each goes
    through ``student.reuse`` and is rendered with the student's chat template."""
    from tapekit.training import make_samples as tapekit_samples

    samples = tapekit_samples(teacher_tapes, reuse_with=student, tokenizer=tokenizer)
    if samples.breaks:
        print(f"note: {len(samples.breaks)} multi-turn merges broke; first: {samples.breaks[0]}")
    return samples.dataset


def train_student(
    settings: Settings, rows: Any, model: Any, tokenizer: Any, lora: bool
) -> tuple[Path, float]:
    """SFT (full for the tiny model, LoRA for SmolLM2); returns the result and the seconds."""
    from tapekit.training import LoraSettings, SFTConfig, train_sft

    config = SFTConfig(
        output_dir=str(settings.out / f"sft-{settings.student}"),
        lora=LoraSettings(r=16, alpha=32) if lora else None,
        learning_rate=settings.learning_rate,
        max_steps=settings.steps,
        batch_size=settings.batch_size,
        packing=settings.packing,
        max_length=settings.max_length,
        warmup_ratio=settings.warmup_ratio,
        lr_scheduler=settings.lr_scheduler,
        logging_steps=max(1, settings.steps // 10),
        device="cpu",
        dtype="float32",
        seed=settings.seed,
    )
    started = time.perf_counter()
    final = train_sft(rows, model=model, tokenizer=tokenizer, config=config)
    return final, time.perf_counter() - started


# ----------------------------------------------------------------------------- students


def tiny_student(settings: Settings, adapted: list[Tape[Any, Any]]) -> tuple[Any, Any, Path]:
    """A fresh tiny model whose tokenizer is trained on the adapted tapes; saved to a directory."""
    from tapekit.testing.tiny import TinyConfig, make_tiny

    path = settings.out / "tiny-base"
    config = TinyConfig(
        vocab_size=512,
        hidden_size=settings.hidden,
        num_layers=settings.layers,
        num_heads=settings.heads,
        intermediate_size=3 * settings.hidden,
        whole_numbers=settings.whole_numbers,
        seed=settings.seed,
    )
    model, tokenizer = make_tiny(tokenizer_texts(adapted, student_system(settings)), config, path)
    return model, tokenizer, path


def student_llm(settings: Settings, model_path: str | None, adapter_path: str | None = None) -> Any:
    """The student's greedy TransformersLLM."""
    from tapekit.llm import TransformersLLM

    return TransformersLLM(
        model_name=f"{settings.student}-student",
        model_path=model_path,
        adapter_path=adapter_path,
        device="cpu",
        max_tokens=48 if settings.student == "tiny" else 64,
    )


def table(results: list[StageResult]) -> Any:
    """The rich table of every stage."""
    from rich.table import Table

    out = Table(title="math distillation: pass@1 [95 % interval] on the split named")
    for column in ("stage", "model", "split", "exact", "lenient", *LEVELS, "tokens/task", "train s"):
        out.add_column(column, justify="left" if column in ("stage", "model", "split") else "right")
    for r in results:
        levels = r.report.by_category()
        out.add_row(
            r.stage,
            r.who,
            f"{r.split} ({r.report.n_tasks})",
            r.report.pass_at_1("strict").short(),
            r.report.pass_at_1("lenient").short(),
            *(f"{levels[c].pass_at_1('strict').value:.2f}" if c in levels else "-" for c in LEVELS),
            f"{r.report.tokens_per_attempt:.0f}",
            f"{r.train_seconds:.0f}" if r.stage in ("sft", "rl") else "-",
        )
    return out


def run(settings: Settings) -> list[StageResult]:
    """The whole pipeline; prints one line per stage as it finishes, and writes them, each with
    its split, to ``OUT/results.json``."""
    import transformers

    from tapekit import open_store

    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass
    transformers.utils.logging.set_verbosity_error()
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    settings.out.mkdir(parents=True, exist_ok=True)
    db = settings.out / "tapes.db"
    if db.exists():
        db.unlink()  # evaluations resume by name: a stale store would give stale scores
    store = open_store(str(db))
    splits = problem_splits(settings)
    train, val, test = splits
    dropped = {name: sum(counts.values()) for name, counts in splits.dropped.items()}
    print(
        f"splits: train={len(train)} val={len(val)} test={len(test)} "
        f"(skipped for a used arithmetic: val {dropped['val']}, test {dropped['test']})",
        flush=True,
    )
    tasks = tasks_for(val)
    oracle = Oracle(train + val + test)
    results: list[StageResult] = []

    def report(result: StageResult) -> None:
        results.append(result)
        print(result.line(), flush=True)

    teacher = make_teacher(teacher_llm(settings, oracle))
    teacher_name = settings.teacher_model or "oracle"
    report(StageResult("teacher", teacher_name, run_eval(teacher, tasks, store, "teacher")))
    good = teach(teacher, train, store)
    print(f"teacher: {len(good)}/{len(train)} training tapes correct, stored in {db}", flush=True)

    if settings.student == "tiny":
        good, adapted = adapt(student_agent(settings, FunctionLLM(fn=lambda p: "")), good)
        model, tokenizer, base = tiny_student(settings, adapted)
        base_path: str | None = str(base)
        before = student_llm(settings, base_path)
    else:
        base_path = None  # the embedded SmolLM2
        before = student_llm(settings, None)
        model, tokenizer = before.load()  # TransformersLLM unmarks the de-quantised GGUF: trainable
        good, _ = adapt(student_agent(settings, before), good)
    zero_shot = run_eval(student_agent(settings, before), tasks, store, "zero_shot")
    report(StageResult("zero_shot", settings.student, zero_shot, model_path=base_path))

    rows = make_samples(good, student_agent(settings, before), tokenizer)
    print(f"samples: {len(rows)} from {len(good)} teacher tapes", flush=True)
    lora = settings.student != "tiny"
    final, seconds = train_student(settings, rows, model, tokenizer, lora)
    # the tuned student: the full model (tiny) or the base with the LoRA adapter (SmolLM2)
    model_path, adapter_path = (base_path, str(final)) if lora else (str(final), None)
    after = student_llm(settings, model_path, adapter_path)
    sft_report = run_eval(student_agent(settings, after), tasks, store, "sft")
    report(StageResult("sft", settings.student, sft_report, seconds, model_path, adapter_path))
    if settings.rl and not lora:
        from examples.math_study.rl_stage import RLStageSettings, after_sft

        rl_settings = RLStageSettings(
            seconds=settings.rl_seconds,
            curriculum=settings.rl_curriculum,
            arms=settings.rl_arms,
            seed=settings.seed,
            out=settings.out / "rl",
        )
        rl_report, rl_seconds = after_sft(final, train, tasks, store, rl_settings)
        rl_path = str(rl_settings.out / "final")
        report(StageResult("rl", settings.student, rl_report, rl_seconds, model_path=rl_path))
    if settings.split == "test":  # the final student, once, on the untouched test split
        last = results[-1]
        tuned = student_llm(settings, last.model_path, last.adapter_path)
        test_report = run_eval(student_agent(settings, tuned), tasks_for(test), store, f"{last.stage}-test")
        report(
            StageResult(
                last.stage,
                settings.student,
                test_report,
                last.train_seconds,
                last.model_path,
                last.adapter_path,
                split="test",
            )
        )
    store.close()
    record = [r.record() for r in results]
    (settings.out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    return results


def problem_splits(settings: Settings) -> Splits:
    """This run's training, validation and test problems. Everything trained on (the teacher's
    tapes for SFT, the RL stage's pool) comes from ``train``; the test problems (drawn only
    with ``split="test"``) share no arithmetic with the training or validation ones."""
    n_test = settings.n_test if settings.split == "test" else 0
    return split_problems(settings.n_train, settings.n_val, n_test, settings.seed, settings.train_weights)


def parse_args(argv: list[str] | None = None) -> Settings:
    """Settings from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer problems and steps (CI, < 5 minutes)")
    parser.add_argument("--student", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--train", type=int, help="training problems")
    parser.add_argument("--val", "--heldout", type=int, dest="val", help="validation problems")
    parser.add_argument("--test-size", type=int, help="test problems (with --split test; default 150)")
    parser.add_argument(
        "--split",
        choices=["val", "test"],
        default="val",
        help="val (default): every stage on the validation split; test: also the final student,"
        " once, on the untouched test split",
    )
    parser.add_argument("--steps", type=int, help="SFT optimiser steps")
    parser.add_argument("--batch-size", type=int, help="samples per SFT step")
    parser.add_argument("--lr", type=float, help="learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--packing", action="store_true", help="pack samples into rows (no padding)")
    parser.add_argument("--hidden", type=int, help="tiny student: hidden size")
    parser.add_argument("--layers", type=int, help="tiny student: layers")
    parser.add_argument("--heads", type=int, help="tiny student: attention heads")
    parser.add_argument("--whole-numbers", type=int, help="tiny student: integers 10..N-1 as one token each")
    parser.add_argument(
        "--scheduler", help="learning-rate schedule (linear, cosine, constant_with_warmup, ...)"
    )
    parser.add_argument("--warmup", type=float, help="warmup share of the steps")
    parser.add_argument("--out", type=Path, help="output directory (default: a new temporary one)")
    parser.add_argument("--teacher-url", help="an OpenAI-compatible endpoint for the teacher")
    parser.add_argument("--teacher-model", help="the teacher's model name at --teacher-url")
    parser.add_argument(
        "--level-weights", help="training problems per level, e.g. 1,2,3 (default) or 1,1,1 (even)"
    )
    parser.add_argument("--rl", action=argparse.BooleanOptionalAction, help="RL after SFT (default: on)")
    parser.add_argument("--rl-seconds", type=float, default=300.0, help="RL stage: training seconds")
    parser.add_argument("--rl-curriculum", choices=["sec", "uniform", "fixed"], default="sec")
    parser.add_argument(
        "--rl-arms", choices=sorted(ARMS), default="levels", help="RL stage: the curriculum's arms"
    )
    args = parser.parse_args(argv)
    settings = Settings(student=args.student, seed=args.seed)
    if args.student == "smollm2":
        settings.n_train, settings.n_val, settings.n_test, settings.steps = 200, 30, 30, 60
        settings.batch_size, settings.learning_rate = 4, 1e-3
    if args.quick:  # the test split keeps its size: --quick --split test gives a narrower interval
        settings.n_train, settings.n_val, settings.steps = 1500, 45, 400
        if args.student == "smollm2":
            settings.n_train, settings.n_val, settings.n_test, settings.steps = 100, 15, 15, 20
    overrides = {  # setting <- command-line option, where the option was given
        "n_train": args.train,
        "n_val": args.val,
        "n_test": args.test_size,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "learning_rate": args.lr,
        "out": args.out,
        "threads": args.threads,
        "hidden": args.hidden,
        "layers": args.layers,
        "heads": args.heads,
        "whole_numbers": args.whole_numbers,
        "lr_scheduler": args.scheduler,
        "warmup_ratio": args.warmup,
    }
    for name, value in overrides.items():
        if value is not None:
            setattr(settings, name, value)
    settings.packing, settings.split = args.packing, args.split
    if args.level_weights is not None:
        counts = args.level_weights.split(",")
        if len(counts) != len(LEVELS) or not all(c.strip().isdigit() for c in counts):
            parser.error(f"--level-weights needs {len(LEVELS)} whole numbers, e.g. 1,2,3")
        settings.train_weights = dict(zip(LEVELS, (int(c) for c in counts), strict=True))
    settings.teacher_url, settings.teacher_model = args.teacher_url, args.teacher_model
    settings.rl = args.rl if args.rl is not None else not args.quick  # RL adds 5 minutes: not in CI
    settings.rl_seconds, settings.rl_curriculum = args.rl_seconds, args.rl_curriculum
    settings.rl_arms = args.rl_arms
    if min(settings.n_train, settings.n_val, settings.n_test, settings.steps) < 1:
        parser.error("--train, --val, --test-size and --steps must be at least 1")
    return settings


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline and print the lines and the table."""
    settings = parse_args(argv)
    started = time.perf_counter()
    results = run(settings)
    from rich.console import Console

    Console(width=160).print(table(results))
    print(f"total_seconds={time.perf_counter() - started:.0f} out={settings.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
