"""A web agent on MiniWob++ in headless Chromium: the programmatic teacher, the embedded SmolLM2-135M
zero-shot, and SmolLM2 with demos from the teacher's tapes chosen by ``optimize()``.

    python examples/web_agent/run.py            # the full run (about an hour on 2 cores)
    python examples/web_agent/run.py --quick    # 2 tasks, a few seeds: the mechanics in minutes

The protocol (every choice on the validation seeds, the test seeds used once per agent):

1. Zero-shot: SmolLM2 with and without a one-line rationale before each action, on the
   validation seeds; the better one is the student.
2. ``optimize()`` with ``BootstrapFewShot(teacher=...)``: the teacher runs the training seeds,
   demos come from its solved episodes, demo sets are scored on the validation seeds, the best
   is kept (or none, when none beats zero-shot).
3. The teacher, the zero-shot student and the optimised student are evaluated once on the test
   seeds (and the students on the held-out tasks); the table shows success with 95 % bootstrap
   intervals and the paired, task-stratified difference optimised - zero-shot.

``--teacher-url/--teacher-model`` use any OpenAI-compatible model as the teacher instead of the
programmatic one. ``--store`` keeps every tape (open them in the Studio); ``--out`` writes the
figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tapekit import Agent, evaluate, open_store
from tapekit.evaluate import EvalReport, Task
from tapekit.llm import LlamaCppLLM, OpenAICompatibleLLM
from tapekit.optimize import BootstrapFewShot, optimize
from tapekit.web import (
    SPLIT,
    WebEnvironment,
    WebObservation,
    eval_tasks,
    raw_reward_mean,
    reward_scorer,
    teacher_agent,
    web_agent,
)

QUICK_TASKS = ["click-button", "focus-text"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 tasks and a few seeds (CI)")
    p.add_argument("--tasks", nargs="*", default=None, help="training tasks (default: all 14)")
    p.add_argument("--train-seeds", type=int, default=None, help="teacher episodes per task for demos")
    p.add_argument("--val-seeds", type=int, default=None, help="validation seeds per task (of 20)")
    p.add_argument("--test-seeds", type=int, default=None, help="test seeds per task (of 20)")
    p.add_argument("--held-out-seeds", type=int, default=None, help="test seeds per held-out task")
    p.add_argument("--candidates", type=int, default=None, help="demo sets BootstrapFewShot scores")
    p.add_argument("--max-demos", type=int, default=4)
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="episodes at once (1: on 2 cores, a second episode slows llama.cpp more than it saves)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="llama.cpp threads (default: half the CPUs; all of them collapses under load)",
    )
    p.add_argument("--teacher-url", default=None, help="an OpenAI-compatible /v1 URL for the teacher")
    p.add_argument("--teacher-model", default=None, help="the teacher model's name at --teacher-url")
    p.add_argument("--store", default=None, help="keep every tape in this store (a path or URL)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--optimize-id",
        default="web-agent",
        help="optimize()'s run id; with --store, a rerun resumes the evaluations already stored",
    )
    args = p.parse_args(argv)
    if bool(args.teacher_url) != bool(args.teacher_model):
        p.error("--teacher-url and --teacher-model go together")
    quick = args.quick
    defaults = {
        "tasks": QUICK_TASKS if quick else list(SPLIT.train_tasks),
        "train_seeds": 2 if quick else 3,
        "val_seeds": 2 if quick else 5,
        "test_seeds": 3 if quick else 20,
        "held_out_seeds": 0 if quick else 5,
        "candidates": 1 if quick else 4,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def make_teacher(args: argparse.Namespace) -> Agent:
    """The programmatic teacher, or an OpenAI-compatible model behind the same web agent node."""
    if args.teacher_url:
        llm = OpenAICompatibleLLM(model_name=args.teacher_model, base_url=args.teacher_url)
        return web_agent(llm, name="teacher", constrain="json")
    return teacher_agent()


def student(rationale: bool, threads: int | None) -> Agent:
    llm = LlamaCppLLM(n_threads=threads, parameters={"temperature": 0.0, "max_tokens": 96})
    return web_agent(llm, rationale=rationale)


def browser_seconds(report: EvalReport) -> float:
    """Mean browser seconds per episode (what the environment measured on its observations)."""
    total = 0.0
    for tape in report.tapes.values():
        for step in tape.steps:
            if isinstance(step, WebObservation):
                total += float(step.metadata.other.get("browser_s", 0.0))
    return total / max(len(report.tapes), 1)


class Timed:
    """Evaluations with their wall time (for episodes per minute)."""

    def __init__(self, env: WebEnvironment, store: Any, concurrency: int) -> None:
        self.env, self.store, self.concurrency = env, store, concurrency
        self.minutes: dict[str, float] = {}

    def __call__(self, name: str, agent: Agent, tasks: list[Task]) -> EvalReport:
        started = time.perf_counter()
        report = evaluate(
            agent,
            self.env,
            tasks,
            reward_scorer,
            name=name,
            store=self.store,
            max_concurrency=self.concurrency,
        )
        self.minutes[name] = (time.perf_counter() - started) / 60
        print(f"  {name}: {report.mean_score().short()} on {len(tasks)} episodes")
        return report


def row(name: str, report: EvalReport, minutes: float | None) -> dict[str, Any]:
    """One agent's figures. ``success`` is the binary reward's mean (MiniWob's raw reward > 0);
    ``raw_reward`` the raw reward's mean (in [-1, 1]), beside it because binary success counts
    partial credit (a click-checkboxes page with no box ticked passes when most should stay
    empty)."""
    est = report.mean_score()
    return {
        "agent": name,
        "success": est.value,
        "low": est.low,
        "high": est.high,
        "raw_reward": raw_reward_mean(report.tapes.values()),
        "episodes": len(report.samples),
        "episodes_per_min": len(report.samples) / minutes if minutes else None,
        "tokens_per_episode": report.tokens_per_attempt,
        "browser_s_per_episode": browser_seconds(report),
        "per_task": {c: sub.mean_score().value for c, sub in report.by_category().items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    train = eval_tasks("train", args.train_seeds, args.tasks)
    val = eval_tasks("validation", args.val_seeds, args.tasks)
    test = eval_tasks("test", args.test_seeds, args.tasks)
    held_out = eval_tasks("held_out", args.held_out_seeds) if args.held_out_seeds else []
    store = open_store(args.store) if args.store else None
    results: dict[str, Any] = {"args": vars(args), "validation": {}, "test": [], "held_out": []}
    with WebEnvironment(max_concurrent=args.concurrency, timeout_s=30) as env:
        run = Timed(env, store, args.concurrency)
        print(f"1. zero-shot SmolLM2 on {len(val)} validation episodes, with and without a rationale")
        zero_val = {
            r: run(f"web/val/zero-shot/rationale-{str(r).lower()}", student(r, args.threads), val)
            for r in (True, False)
        }
        rationale = zero_val[True].mean_score().value > zero_val[False].mean_score().value
        results["validation"]["zero_shot"] = {str(r): rep.mean_score().value for r, rep in zero_val.items()}
        results["validation"]["rationale"] = rationale
        print(f"   chosen on validation: rationale={rationale}")

        print(f"2. optimize(): demos from the teacher's tapes on {len(train)} training episodes")
        teacher = make_teacher(args)
        optimizer = BootstrapFewShot(teacher=teacher, max_demos=args.max_demos, n_candidates=args.candidates)
        budget = len(val) * (1 + args.candidates) + len(train)
        started = time.perf_counter()
        result = optimize(
            student(rationale, args.threads),
            train,
            val,
            reward_scorer,
            optimizer=optimizer,
            budget=budget,
            store=store,
            seed=args.seed,
            run_id=args.optimize_id,
            environment=env,
            max_concurrency=args.concurrency,
        )
        optimize_minutes = (time.perf_counter() - started) / 60
        result.print()
        results["validation"]["candidates"] = [
            {"id": c.id, "note": c.note, "success": c.mean()} for run_ in result.runs for c in run_.candidates
        ]
        results["validation"]["chosen"] = {
            "id": result.best.id,
            "success": result.best.mean(),
            "note": result.best.note,
        }

        print(f"3. the test seeds, once each ({len(test)} episodes per agent)")
        optimised = f"SmolLM2 optimised ({result.best.note or 'no demos'})"
        agents = {
            "teacher": ("web/test/teacher", teacher),
            "SmolLM2 zero-shot": ("web/test/zero-shot", student(rationale, args.threads)),
            optimised: ("web/test/optimised", result.agent),
        }
        reports = {label: run(name, agent, test) for label, (name, agent) in agents.items()}
        results["test"] = [
            row(label, reports[label], run.minutes[name]) for label, (name, _) in agents.items()
        ]
        zero, best = reports["SmolLM2 zero-shot"], reports[optimised]
        diff = best.compare(zero)
        results["test_difference"] = {"value": diff.value, "low": diff.low, "high": diff.high}
        results["optimize_minutes"] = optimize_minutes
        if held_out:
            print(f"4. held-out tasks ({len(held_out)} episodes per agent)")
            base_agent = student(rationale, args.threads)
            for label, agent in (("SmolLM2 zero-shot", base_agent), ("SmolLM2 optimised", result.agent)):
                name = f"web/held-out/{label.split()[-1]}"
                results["held_out"].append(row(label, run(name, agent, held_out), run.minutes[name]))
        results["browser"] = dict(env.stats)
    print_table(results, diff)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
        print(f"figures written to {args.out}")
    return results


def print_table(results: dict[str, Any], diff: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="MiniWob++ test seeds (each agent evaluated once; choices made on validation)")
    for col in (
        "agent",
        "success [95% CI]",
        "raw reward",
        "episodes",
        "episodes/min",
        "tokens/episode",
        "browser s/episode",
    ):
        table.add_column(col, justify="left" if col == "agent" else "right")
    for r in results["test"] + [dict(x, agent=x["agent"] + " (held-out tasks)") for x in results["held_out"]]:
        rate = f"{r['episodes_per_min']:.1f}" if r["episodes_per_min"] else "-"
        table.add_row(
            r["agent"],
            f"{r['success']:.3f} [{r['low']:.3f}, {r['high']:.3f}]",
            "-" if r["raw_reward"] is None else f"{r['raw_reward']:+.3f}",
            str(r["episodes"]),
            rate,
            f"{r['tokens_per_episode']:,.0f}",
            f"{r['browser_s_per_episode']:.2f}",
        )
    table.caption = (
        f"optimised - zero-shot on the test seeds (paired, task-stratified bootstrap): {diff}\n"
        "success: MiniWob's raw reward > 0 (partial credit passes); raw reward: its mean, in [-1, 1]"
    )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
