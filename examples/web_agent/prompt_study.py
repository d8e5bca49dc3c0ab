"""Prompt optimisation of the embedded SmolLM2-135M web agent: task-matched demos and other
named variants scored by ``optimize()`` on the validation seeds, the choice tested once.

    python examples/web_agent/prompt_study.py --out runs/web-prompts          # the study
    python examples/web_agent/prompt_study.py --out runs/web-prompts --quick  # the mechanics

The same command continues a stopped run: every tape goes to ``OUT/tapes.db`` and
``optimize()`` resumes the evaluations stored under its run id; the test stage writes
``OUT/test.json`` once and is not run again.

Protocol, fixed before anything ran:

- **Model**: the embedded SmolLM2-135M-Instruct (fp32, greedy, answers of at most 96 tokens held
  to the page's bids by the page grammar), untrained: the study is about prompts alone. Episodes
  are decoded together (``BatchedTransformersLLM``, up to 32 at a time).
- **Split** (``tapekit.web.SPLIT``): the 14 training tasks. Demos come from the programmatic
  teacher's solved episodes on ``--train-seeds`` training seeds per task; choices are made on the
  first ``--val-seeds`` validation seeds per task; the test seeds are the split's test seeds
  ``TEST_FIRST`` .. ``TEST_FIRST + --test-seeds - 1`` of each task (no other study has used test
  seeds past 20), and the first ``--held-out-seeds`` test seeds of the 8 held-out tasks.
- **Candidates** (:data:`VARIANTS`): the baseline is zero-shot with the one-line rationale; the
  variants are zero-shot without it, the teacher's demos picked per episode by the page goal
  (``DemoPick``: the 1 or 2 nearest, so an episode sees demos of its own task), with and without
  the rationale, 2 random demos in every prompt (the earlier study's kind), and the nearest
  demo with an instruction that says to copy the bid. Each is scored on the same validation
  episodes; ``optimize()`` keeps the best.
- **Test, once**: the best zero-shot configuration (the baseline or the no-rationale variant,
  whichever scored higher on validation; the baseline on a tie) and the best configuration with
  demos (the same rule among the demo variants). Paired, task-stratified bootstrap interval of
  the difference (10,000 resamples), and the same on the held-out tasks.
- **Costs**: per candidate, prompt and output tokens per episode and seconds per episode of its
  validation run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.web_agent.study import load_student
from tapekit import Agent, evaluate, open_store
from tapekit.evaluate import EvalReport, Task
from tapekit.frameworks import DemoPick
from tapekit.llm import BatchedTransformersLLM
from tapekit.optimize import Candidate, Variant, VariantSearch, optimize, with_params
from tapekit.web import (
    DEFAULT_INSTRUCTION,
    SPLIT,
    WebEnvironment,
    reward_scorer,
    start_tape,
    teacher_agent,
    web_agent,
)

MAX_TOKENS = 96
"""The answer's cap (the earlier zero-shot study's): a thought and an action fit in it."""

TEST_FIRST = 28
"""The first test seed index used here (indices 28..39 of the split's 40 per task)."""

COPY_BID = (
    DEFAULT_INSTRUCTION
    + " The element to act on is named in the goal: find it in the tree and copy its bid exactly."
)


def _pick(k: int) -> dict[str, Any]:
    return {"demo_pick": DemoPick(k=k).model_dump()}


VARIANTS: tuple[Variant, ...] = (
    Variant(name="zero-shot-no-rationale", options={"rationale": False}),
    Variant(name="nearest-1", demos="pool", options=_pick(1)),
    Variant(name="nearest-2", demos="pool", options=_pick(2)),
    Variant(name="nearest-1-no-rationale", demos="pool", options={**_pick(1), "rationale": False}),
    Variant(name="nearest-2-no-rationale", demos="pool", options={**_pick(2), "rationale": False}),
    Variant(name="random-2", demos=2),
    Variant(name="nearest-1-copy-bid", demos="pool", instruction=COPY_BID, options=_pick(1)),
)
"""The candidates besides the baseline (zero-shot, with the rationale), in the order scored."""

QUICK_TASKS = ["click-button", "focus-text"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/web-prompts"))
    p.add_argument("--quick", action="store_true", help="2 tasks, 1 seed each, 1 variant (the mechanics)")
    p.add_argument("--train-seeds", type=int, default=3, help="teacher episodes per task (the demo pool)")
    p.add_argument("--val-seeds", type=int, default=4, help="validation seeds per task")
    p.add_argument("--test-seeds", type=int, default=12, help="test seeds per task, from TEST_FIRST")
    p.add_argument("--held-out-seeds", type=int, default=5, help="test seeds per held-out task")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.quick:
        args.train_seeds, args.val_seeds, args.test_seeds, args.held_out_seeds = 1, 1, 1, 0
    if args.test_seeds + TEST_FIRST > len(SPLIT.test_seeds):
        p.error(f"--test-seeds: at most {len(SPLIT.test_seeds) - TEST_FIRST} (test seeds {TEST_FIRST}..)")
    return args


def tasks_of(names: list[str], seeds: list[int]) -> list[Task]:
    return [Task(id=f"{t}/{s}", start=start_tape(t, s), category=t) for t in names for s in seeds]


def student(threads: int) -> Agent:
    """The untrained embedded SmolLM2, greedy, episodes decoded together, rationale on."""
    import torch

    torch.set_num_threads(threads)
    model, tokenizer = load_student()
    llm = BatchedTransformersLLM.from_model(model, tokenizer, temperature=0.0, max_tokens=MAX_TOKENS)
    llm.batcher.max_wait_s = 0.5
    return web_agent(llm, name="student", constrain="page", rationale=True)


def cost_row(candidate: Candidate) -> dict[str, Any]:
    """A candidate's validation success and what it cost per episode."""
    report = candidate.val
    assert report is not None
    n = max(len(report.samples), 1)
    return {
        "id": candidate.id,
        "variant": candidate.note or "baseline (zero-shot, rationale)",
        "success": candidate.mean(),
        "per_task": {t: sub.mean_score().value for t, sub in report.by_category().items()},
        "prompt_tokens_per_episode": sum(s.prompt_tokens for s in report.samples) / n,
        "output_tokens_per_episode": sum(s.output_tokens for s in report.samples) / n,
        "seconds_per_episode": candidate.seconds / n,
        "demos": sum(len(p.demos or []) for p in candidate.params.values()),
    }


def best_of(candidates: list[Candidate]) -> Candidate:
    """The highest validation success; the earliest on a tie."""
    best = candidates[0]
    for c in candidates[1:]:
        if c.mean() > best.mean():
            best = c
    return best


def pair(a: EvalReport, b: EvalReport) -> dict[str, Any]:
    diff = a.compare(b)
    return {"difference": diff.value, "low": diff.low, "high": diff.high}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    names = QUICK_TASKS if args.quick else list(SPLIT.train_tasks)
    variants = [VARIANTS[1]] if args.quick else list(VARIANTS)
    train = tasks_of(names, list(SPLIT.train_seeds[: args.train_seeds]))
    val = tasks_of(names, list(SPLIT.validation_seeds[: args.val_seeds]))
    test = tasks_of(names, list(SPLIT.test_seeds[TEST_FIRST : TEST_FIRST + args.test_seeds]))
    held_out = tasks_of(list(SPLIT.held_out_tasks), list(SPLIT.test_seeds[: args.held_out_seeds]))
    store = open_store(out / "tapes.db")
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    agent = student(args.threads)
    with WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        started = time.perf_counter()
        result = optimize(
            agent,
            train,
            val,
            reward_scorer,
            optimizer=VariantSearch(variants=variants, teacher=teacher_agent()),
            budget=len(val) * (1 + len(variants)) + len(train),
            store=store,
            run_id="web-prompts",
            environment=env,
            max_concurrency=32,
            environment_retries=1,
        )
        result.print()
        candidates = [result.baseline, *(c for run in result.runs for c in run.candidates)]
        figures["validation"] = [cost_row(c) for c in candidates]
        figures["optimize_seconds"] = time.perf_counter() - started
        figures["chosen"] = result.best.note or "baseline"
        zero = best_of([c for c in candidates if not any(p.demos for p in c.params.values())])
        demo = best_of([c for c in candidates if any(p.demos for p in c.params.values())])
        figures["tested"] = {"zero_shot": zero.note or "baseline", "demos": demo.note}
        test_file = out / "test.json"
        if test_file.exists():
            figures["test"] = json.loads(test_file.read_text())
        else:
            figures["test"] = run_test(agent, env, store, zero, demo, test, held_out)
            test_file.write_text(json.dumps(figures["test"], indent=2) + "\n")
    (out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(
        json.dumps(
            {"chosen": figures["chosen"], "tested": figures["tested"], "test": figures["test"]["summary"]}
        )
    )
    return figures


def run_test(
    agent: Agent,
    env: WebEnvironment,
    store: Any,
    zero: Candidate,
    demo: Candidate,
    test: list[Task],
    held_out: list[Task],
) -> dict[str, Any]:
    """The two chosen configurations, once each, on the test seeds and the held-out tasks."""
    out: dict[str, Any] = {"summary": {}}
    for split, tasks in (("test", test), ("held_out", held_out)):
        if not tasks:
            continue
        reports = {}
        for label, cand in (("zero_shot", zero), ("demos", demo)):
            started = time.perf_counter()
            reports[label] = evaluate(
                with_params(agent, cand.params),
                env,
                tasks,
                reward_scorer,
                name=f"web-prompts/{split}/{label}",
                store=store,
                max_concurrency=32,
                environment_retries=1,
            )
            rep = reports[label]
            out[f"{split}/{label}"] = {
                "variant": cand.note or "baseline",
                "success": rep.mean_score().value,
                "low": rep.mean_score().low,
                "high": rep.mean_score().high,
                "episodes": len(rep.samples),
                "per_task": {t: s.mean_score().value for t, s in rep.by_category().items()},
                "per_episode": {s.task_id: s.scores[rep.scorers[0]].value for s in rep.samples},
                "prompt_tokens_per_episode": sum(s.prompt_tokens for s in rep.samples)
                / max(len(rep.samples), 1),
                "seconds": time.perf_counter() - started,
            }
        out["summary"][split] = pair(reports["demos"], reports["zero_shot"])
    return out


if __name__ == "__main__":
    main()
