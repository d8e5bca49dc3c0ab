"""GRPO updates per hour in the web study's setting, engine settings side by side in one sitting.

The setting is the study's RL stage (examples/web_agent/study.py): the SmolLM2-135M student,
fully fine-tuned in fp32 on 2 CPU cores, GRPO on the 14 MiniWob++ training tasks in headless
Chromium, ``--tasks-per-step`` 4 tasks x ``--group-size`` 4 attempts per step, temperature 1,
the answer held to the page's bids, no rationale, episodes run to their end. The policy GRPO
starts from is an SFT student, as in the study's ``sft_rl`` arm: ``--sft-steps`` steps on the
programmatic teacher's solved episodes (made once and kept in ``--student``; a base model's
episodes run many turns and would measure another setting).

Each configuration (``--configs``) starts from the same student weights and seeds and runs
``--steps`` on-policy steps; ``--rounds`` > 1 alternates them. Reported per configuration: wall
seconds, **updates per hour** (GRPO steps per hour of wall time, rollouts and update included),
seconds per step in rollouts and in training, episodes per minute, prompt tokens prefilled, and
informative groups. The configurations:

- ``before``: rollouts prefill every row's prompt (``rollouts.share_prompts=False``), sync;
- ``shared``: a group's identical prompts prefilled once, sync (the default);
- ``async``: ``shared``, with the rollouts of step n+1 made while step n trains (``mode=async``,
  one version of lag);
- ``eval-before`` / ``eval-shared``: no training, the study's greedy evaluation of the student
  (``--eval-seeds`` validation seeds of each of the 14 tasks, up to 32 episodes decoded
  together) with the prompts' shared parts prefilled once or not: seconds per episode.

    python bench/grpo.py                                  # ~30 minutes on 2 cores
    python bench/grpo.py --configs before,shared --steps 4 --rounds 2
    git worktree add /tmp/before ae42f21 && python bench/grpo.py --before-tree /tmp/before

Each configuration runs in a process of its own; with ``--before-tree`` the ``before`` ones
import tapekit from that checkout (the code before the change, whole), the others from this one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("before", "shared", "async", "eval-before", "eval-shared")


def student(path: Path, sft_steps: int, teacher_seeds: int) -> None:
    """Make the SFT student in ``path`` (once): the teacher's solved episodes on the 14 training
    tasks, then ``sft_steps`` optimiser steps of 8 rows at the study's learning rate."""
    from tapekit import evaluate, open_store
    from tapekit.evaluate import Task
    from tapekit.llm import TransformersLLM
    from tapekit.training import SFTConfig, make_samples, train_sft
    from tapekit.web import WebEnvironment, web_agent, without_thoughts
    from tapekit.web.miniwob import SPLIT, reward_scorer, start_tape
    from tapekit.web.teacher import teacher_agent

    model, tokenizer = TransformersLLM(device="cpu", dtype="float32").load()
    tasks = [
        Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
        for t in SPLIT.train_tasks
        for s in SPLIT.train_seeds[:teacher_seeds]
    ]
    with tempfile.TemporaryDirectory() as tmp, WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        store = open_store(str(Path(tmp) / "teacher.db"))
        report = evaluate(teacher_agent(), env, tasks, reward_scorer, name="teacher", store=store)
        solved = {s.tape_id for s in report.samples if next(iter(s.scores.values())).value > 0}
        tapes = [without_thoughts(t) for i, t in report.tapes.items() if i in solved]
        agent = web_agent(TransformersLLM.from_model(model, tokenizer), constrain="page", rationale=False)
        samples = make_samples(tapes, reuse_with=agent, tokenizer=tokenizer)
        config = SFTConfig(
            output_dir=str(Path(tmp) / "sft"),
            lora=None,
            learning_rate=5e-5,
            lr_scheduler="constant",
            max_steps=sft_steps,
            batch_size=2,
            grad_accum=4,
            max_length=1024,
            device="cpu",
            dtype="auto",
            seed=0,
        )
        train_sft(samples.dataset, model, tokenizer=tokenizer, config=config)
        store.close()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"student: {len(tapes)} teacher episodes, {sft_steps} SFT steps, saved to {path}", flush=True)


def evaluation(name: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The student's greedy evaluation on validation seeds, timed (``eval-before``/``eval-shared``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tapekit import evaluate, open_store
    from tapekit.llm import BatchedTransformersLLM
    from tapekit.web import WebEnvironment, web_agent
    from tapekit.web.miniwob import eval_tasks, reward_scorer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    knobs = (
        {"share_prompts": name == "eval-shared"}
        if "share_prompts" in BatchedTransformersLLM.model_fields
        else {}
    )
    llm = BatchedTransformersLLM.from_model(model, tokenizer, temperature=0.0, max_tokens=64, **knobs)
    llm.batcher.max_wait_s = 0.5  # as the study's evaluation
    tasks = eval_tasks("validation", args.eval_seeds)
    with tempfile.TemporaryDirectory() as tmp, WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        store = open_store(str(Path(tmp) / "eval.db"))
        started = time.perf_counter()
        report = evaluate(
            web_agent(llm, name="student", constrain="page", rationale=False),
            env,
            tasks,
            reward_scorer,
            store=store,
            max_concurrency=32,
        )
        seconds = time.perf_counter() - started
        store.close()
    score = report.mean_score()
    return {
        "config": name,
        "episodes": len(tasks),
        "seconds": round(seconds, 1),
        "s_per_episode": round(seconds / len(tasks), 3),
        "success": None if score is None else round(score.value, 3),
        "generate_s": round(llm.batcher.stats.generate_s, 1),
        "mean_batch": round(llm.batcher.stats.mean_batch, 1),
    }


def run(name: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``args.steps`` GRPO steps of configuration ``name`` from the student in ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tapekit import open_store
    from tapekit.evaluate import Task
    from tapekit.training import RLRunConfig, RLSetup, train_rl
    from tapekit.training.rl import CurriculumConfig, GRPOConfig, RolloutConfig
    from tapekit.web import WebEnvironment, web_agent
    from tapekit.web.miniwob import SPLIT, reward_scorer, start_tape

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = [
        Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
        for t in SPLIT.train_tasks
        for s in SPLIT.train_seeds[500 : 500 + args.pool_seeds]  # the study's RL pool of seed 0
    ]
    with tempfile.TemporaryDirectory() as tmp, WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        setup = RLSetup(
            agent_for=lambda llm: web_agent(llm, name="student", constrain="page", rationale=False),
            environment=env,
            tasks=tasks,
            scorers={"reward": reward_scorer},
            reward="reward",
        )
        config = RLRunConfig(
            output_dir=tmp,
            steps=args.steps,
            learning_rate=args.lr,
            mode="async" if name == "async" else "sync",
            grpo=GRPOConfig(scale_rewards=False, micro_batch_size=4),
            rollouts=RolloutConfig(
                tasks_per_step=args.tasks_per_step,
                group_size=args.group_size,
                temperature=1.0,
                max_tokens=64,
                max_loops=None,
                **(
                    {"share_prompts": name != "before"}
                    if "share_prompts" in RolloutConfig.model_fields
                    else {}
                ),
            ),
            curriculum=CurriculumConfig(kind="uniform"),
            lora=None,
            seed=0,
            checkpoint=False,
        )
        store = open_store(str(Path(tmp) / "rollouts.db"))
        result = train_rl(setup, model, tokenizer, config, store=store)
        store.close()
    steps = result.history
    rollout = [r.rollout_seconds for r in steps]
    return {
        "config": name,
        "steps": len(steps),
        "seconds": round(result.seconds, 1),
        "updates_per_hour": round(result.steps_per_hour, 1),
        "rollout_s_per_step": round(statistics.fmean(rollout), 2),
        "train_s_per_step": round(statistics.fmean(r.step_seconds - r.rollout_seconds for r in steps), 2),
        "episodes_per_min": round(60 * sum(r.rollouts for r in steps) / sum(rollout), 1),
        "prompt_tokens_per_step": round(statistics.fmean(r.rollout_prompt_tokens for r in steps)),
        "output_tokens_per_step": round(statistics.fmean(r.rollout_output_tokens for r in steps)),
        "trained_tokens_per_step": round(statistics.fmean(r.train_input_tokens for r in steps)),
        "informative_groups": sum(r.groups - round(r.zero_adv_share * r.groups) for r in steps),
        "reward_mean": round(statistics.fmean(r.reward or 0.0 for r in steps), 3),
    }


def one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Configuration ``name`` in a process of its own (tapekit from ``--before-tree`` for the
    before configurations, when given); its row, with the commit of the tapekit it imported."""
    tree = Path(args.before_tree) if args.before_tree and name in ("before", "eval-before") else ROOT
    argv = [a for a in sys.argv[1:] if not a.startswith("--one")]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv, "--one", name],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
    )
    rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode or not rows:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=tree
    ).stdout.strip()
    return {**json.loads(rows[-1]), "tapekit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--student", default=str(Path(tempfile.gettempdir()) / "tapekit-bench-student"))
    parser.add_argument("--sft-steps", type=int, default=6)
    parser.add_argument("--teacher-seeds", type=int, default=4)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--pool-seeds", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--eval-seeds", type=int, default=4, help="validation seeds per task (eval-*)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="append the results as JSON lines here")
    parser.add_argument(
        "--before-tree",
        help="a checkout of the code before (e.g. `git worktree add /tmp/before ae42f21`): the "
        "before and eval-before configurations import tapekit from it, the others from this tree",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one configuration in this process
    args = parser.parse_args()
    if args.one:
        import torch

        torch.set_num_threads(args.threads)
        measure = evaluation if args.one.startswith("eval-") else run
        import tapekit

        row = {**measure(args.one, Path(args.student), args), "imported": str(Path(tapekit.__file__).parent)}
        print("ROW " + json.dumps(row), flush=True)
        return
    configs = args.configs.split(",")
    if unknown := sorted(set(configs) - set(CONFIGS)):
        parser.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    import torch

    torch.set_num_threads(args.threads)
    path = Path(args.student)
    if not (path / "config.json").exists():
        student(path, args.sft_steps, args.teacher_seeds)
    machine = f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at start"
    print(
        f"# {machine}; {args.tasks_per_step} tasks x {args.group_size} attempts, {args.steps} steps",
        flush=True,
    )
    rows = []
    for round_ in range(args.rounds):
        for name in configs:
            started = time.strftime("%Y-%m-%dT%H:%M:%S")
            row = {"round": round_, "started": started, **one(name, args)}
            row["load_after"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"machine": machine, **row}) + "\n")
    for name in configs:
        key = "s_per_episode" if name.startswith("eval-") else "updates_per_hour"
        mine = [r[key] for r in rows if r["config"] == name]
        print(f"{name:12s} {key} {statistics.fmean(mine):8.2f}  ({', '.join(map(str, mine))})")


if __name__ == "__main__":
    main()
