"""GRPO on MiniWob++ tasks that no teacher covers: a reward and no demonstrations.

The practical case for RL: an SFT student trained on the 14 tasks that have a programmatic
teacher, then GRPO, in the browser, only on tasks that have none (and are not among the
held-out tasks, which stay untouched for generalisation). Every stage writes its files under
``--out`` and picks up where it stopped when run again (the same command):

    python examples/web_agent/teacherless.py sft            # the SFT student (teacher episodes, then SFT)
    python examples/web_agent/teacherless.py screen         # the candidates on their validation seeds
    python examples/web_agent/teacherless.py rl --seed 0    # GRPO on the chosen tasks (resumes)
    python examples/web_agent/teacherless.py test           # once, for the final runs: before and after
    python examples/web_agent/teacherless.py probe --policy rl-seed0 --probe-temperature 1   # validation
    python examples/web_agent/teacherless.py all --seeds 0 1 2   # everything above, in order

The student's agent, its evaluation (greedy, up to 32 episodes decoded together, a browser
failure run once more) and its answer cap are the web study's (``examples/web_agent/study.py``).

- ``sft``: the teacher's solved episodes on ``--teacher-seeds`` training seeds of each of the 14
  tasks, then ``--sft-steps`` SFT steps (8 rows, learning rate 5e-5, as the web study's SFT),
  checkpointed every 5 steps. The student is ``OUT/sft/final``. On a fresh checkout (the
  committed ``sft/teacher.json`` names tapes that are not in the uncommitted ``tapes.db``) the
  teacher runs again (``--teacher-concurrency`` pages at once) and must solve as many episodes
  as recorded; ``--new-student`` trains a student on what it solves otherwise (that student's
  figures are then measured again; the first record stays in ``sft/teacher.recorded.json``).
- ``screen``: the student, greedy, on ``--screen-seeds`` validation seeds of each of
  :data:`CANDIDATES` (fixed here, before anything was run). The RL tasks are those it solves
  5–60 % of the time (a task it always fails gives GRPO no signal; one it mostly solves leaves
  little to gain); ``screen.json`` lists every candidate and the choice. The choice is then
  written into the split (``tapekit.web.miniwob.TEACHERLESS_TASKS``), with its own training,
  validation and test seeds.
- ``rl --seed S``: GRPO from the student on the RL tasks' training seeds (``--rl-seeds`` of
  each, from ``1000 S + 500``), ``--steps`` steps of ``--tasks-per-step`` pages with
  ``--group-size`` attempts each, the rewards compared within each task (``--group-key
  category``: the student's attempts at one page nearly always score alike, so a page is no
  group), a checkpoint after every step
  (``OUT/rl-seedS``: weights, optimiser, RNG, curriculum, log), the validation seeds scored
  every ``--eval-every`` steps (``val.jsonl``). Killed, the same command continues. A changed
  setting is an arm of its own: ``--arm NAME`` (e.g. ``rl --arm t07 --temperature 0.7``) runs
  into ``OUT/rl-NAME-seedS``.
- ``test``: the student and each finished seed's final policy (every arm), greedy, on the RL
  tasks' test seeds and the 14 teacher tasks' test seeds (forgetting), then sampled at T = 1 on
  the same episodes; each policy is evaluated once (``test.json`` keeps
  the result, and a second call only adds what is not there yet).
- ``probe --policy P --probe-temperature T``: a finished policy (``student``, ``rl-seed0``, ...) on
  the RL tasks' validation seeds at temperature T (``probe.jsonl``): what a setting for the
  next seeds is chosen on.

Every stage's wall seconds go to ``OUT/ledger.jsonl``; tapes to ``OUT/tapes.db``. The write-up
is docs/experiments/web-teacherless.md, its tables and picture drawn by
scripts/plot_teacherless.py from these files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.web_agent.study import Settings, evaluate_student, load_student, sample_reward, student_agent
from tapekit import ReconstructionError, evaluate, open_store
from tapekit.evaluate import Task
from tapekit.llm import TransformersLLM
from tapekit.training import (
    CurriculumConfig,
    GRPOConfig,
    RLRunConfig,
    RLSetup,
    RolloutConfig,
    SFTConfig,
    StepCallback,
    StepRecord,
    make_samples,
    train_rl,
    train_sft,
)
from tapekit.web import (
    SPLIT,
    TEACHERLESS_TASKS,
    WebEnvironment,
    eval_tasks,
    reward_scorer,
    start_tape,
    teacher_agent,
    without_thoughts,
)

CANDIDATES: tuple[str, ...] = (
    "click-test",
    "click-test-2",
    "click-test-transfer",
    "click-widget",
    "click-checkboxes-soft",
    "click-checkboxes-transfer",
    "click-tab-2-medium",
    "enter-text-dynamic",
    "unicode-test",
    "identify-shape",
    "sign-agreement",
    "social-media",
    "email-inbox-delete",
    "multi-orderings",
    "find-word",
    "odd-or-even",
)
"""The tasks screened for RL, fixed before any was run: MiniWob++ tasks with no teacher, not
held out, whose pages read as text in the accessibility tree (no drawing or dragging)."""

SCREEN_RANGE = (0.05, 0.60)
"""A candidate is an RL task when the student's greedy validation success is in this range."""

MAX_TOKENS = Settings.max_tokens  # the study's answer cap: the page schema keeps answers within it
STUDENT = "sft/final"  # where train_sft leaves the SFT student, under OUT


def log(out: Path, stage: str, seconds: float, **more: Any) -> None:
    """One line of ``OUT/ledger.jsonl``: a stage's wall seconds."""
    with (out / "ledger.jsonl").open("a") as f:
        f.write(json.dumps({"stage": stage, "seconds": round(seconds, 1), **more}) + "\n")


def student_id(out: Path) -> str:
    """Which SFT student ``OUT/sft/final`` is: the first 16 hex digits of the SHA-256 of its
    weights. A student rebuilt on a fresh checkout may differ from the first (``--new-student``);
    every RL run and probe records the id of the student it started from (lines without one
    are the first student's, ``sft/teacher.recorded.json``)."""
    import hashlib

    with (out / STUDENT / "model.safetensors").open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def check_student(run: Path, student: str) -> None:
    """Record in ``run/student.json`` the student a run starts from; a run resumed on another
    student stops (its checkpoints continue the first)."""
    started = started_from(run)
    if started is None:
        (run / "student.json").write_text(json.dumps({"student": student}) + "\n")
    elif started != student:
        raise SystemExit(
            f"{run.name} started from student {started}; {STUDENT} is now {student} "
            "(a rebuilt student: run this arm's seeds again in a new --arm)"
        )


def started_from(run: Path) -> str | None:
    """The id of the student ``run`` started from (None: the first student, unrecorded)."""
    path = run / "student.json"
    return json.loads(path.read_text())["student"] if path.exists() else None


def load(path: Path) -> tuple[Any, Any]:
    """A student saved by ``train_sft`` (``save_pretrained``), in fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(
        path
    )


def success(table: dict[str, dict[str, float]]) -> float:
    """The mean reward over every episode of a :func:`per_task` table; a ``ValueError`` when it
    has none (every episode failed by the browser: no figure, rather than a made-up 0)."""
    values = [v for seeds in table.values() for v in seeds.values()]
    if not values:
        raise ValueError("no scored episode: the environment failed every one")
    return sum(values) / len(values)


def per_task(report: Any) -> dict[str, dict[str, float]]:
    """``{task: {seed: reward}}`` of a report, environment failures left out."""
    table: dict[str, dict[str, float]] = {}
    for sample in report.without_environment_failures().samples:
        task, seed = sample.task_id.rsplit("/", 1)
        table.setdefault(task, {})[seed] = sample_reward(sample)
    return table


# --- stages -------------------------------------------------------------------------------


def student_sft_data(store: Any, ids: list[str], model: Any, tokenizer: Any) -> tuple[Any, list[str]]:
    """The training samples of the stored teacher tapes ``ids`` as the student would write them
    (no rationale: the teacher's thoughts are not part of what it learns), and the ids of the
    tapes left out because the student's agent would not have written them (it aborts a 4th
    identical action in a row)."""
    student = student_agent(TransformersLLM.from_model(model, tokenizer))
    tapes, dropped = [], []
    for tape in (without_thoughts(store.get_tape(i)) for i in ids):
        try:
            student.reuse(tape)
            tapes.append(tape)
        except ReconstructionError:
            dropped.append(tape.metadata.id)
    if dropped:
        print(
            f"sft: {len(dropped)} teacher tapes the student cannot reproduce left out: {dropped}",
            flush=True,
        )
    return make_samples(tapes, reuse_with=student, tokenizer=tokenizer).dataset, dropped


def sft_config(output_dir: Path, *, seed: int, max_steps: int, save_steps: int) -> SFTConfig:
    """The web studies' SFT: a full fine-tune on CPU, 8 packed rows of up to 1,024 tokens a step,
    learning rate 5e-5 constant; resumes from a checkpoint in ``output_dir`` when there is one."""
    return SFTConfig(
        output_dir=str(output_dir),
        lora=None,
        learning_rate=5e-5,
        lr_scheduler="constant",
        max_steps=max_steps,
        batch_size=2,  # packed rows of up to 1,024 tokens
        grad_accum=4,
        max_length=1024,
        device="cpu",
        dtype="auto",
        seed=seed,
        logging_steps=1,
        save_steps=save_steps,
        save_total_limit=1,
        resume=any(output_dir.glob("checkpoint-*")),
    )


def rl_setup(env: WebEnvironment, tasks: Sequence[str], seed: int, per_task: int) -> RLSetup:
    """Training seed ``seed``'s GRPO setup: the student's agent in ``env``, rewarded by the task's
    own reward, on a pool of ``per_task`` training seeds of each task (after the teacher's seeds,
    apart from every other training seed's pool)."""
    first = 1000 * seed + 500
    pool = [
        Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
        for t in tasks
        for s in SPLIT.train_seeds[first : first + per_task]
    ]
    return RLSetup(
        agent_for=student_agent,
        environment=env,
        tasks=pool,
        scorers={"reward": reward_scorer},
        reward="reward",
    )


def rl_config(
    run: Path,
    *,
    seed: int,
    steps: int,
    lr: float,
    temperature: float,
    kl_coef: float,
    group_key: str,
    tasks_per_step: int,
    group_size: int,
    resample_rounds: int = 0,
) -> RLRunConfig:
    """The web studies' GRPO into ``run``: full fine-tune, unscaled group advantages, a uniform
    curriculum, answers of at most :data:`MAX_TOKENS`, a checkpoint every update (resumed) and a
    journal (``run/journal``, committed with the logs: on a new machine the same command replays
    the updates from it without rollouts, then goes on)."""
    return RLRunConfig(
        output_dir=str(run),
        run_name=run.name,
        steps=steps,
        learning_rate=lr,
        grpo=GRPOConfig(scale_rewards=False, micro_batch_size=4, kl_coef=kl_coef, group_key=group_key),
        rollouts=RolloutConfig(
            tasks_per_step=tasks_per_step,
            group_size=group_size,
            temperature=temperature,
            max_tokens=MAX_TOKENS,
            max_loops=None,
            resample_rounds=resample_rounds,
        ),
        curriculum=CurriculumConfig(kind="uniform"),
        lora=None,
        seed=seed,
        checkpoint=True,
        journal=True,
        resume=True,
    )


def _stored(store: Any, tape_id: str) -> bool:
    try:
        store.get_tape_info(tape_id)
    except KeyError:
        return False
    return True


def stage_sft(args: argparse.Namespace, out: Path) -> None:
    """The SFT student in ``OUT/sft/final`` (skipped when it is there; resumes its checkpoints)."""
    if (out / STUDENT / "config.json").exists():
        print(f"sft: {out / STUDENT} is there", flush=True)
        return
    started = time.perf_counter()
    model, tokenizer = load_student()
    store = open_store(str(out / "tapes.db"))
    solved_file = out / "sft" / "teacher.json"  # the solved teacher tapes' ids (the tapes are in tapes.db)
    solved_file.parent.mkdir(parents=True, exist_ok=True)
    record_file = solved_file.with_suffix(".recorded.json")
    listed = json.loads(solved_file.read_text())["solved"] if solved_file.exists() else []
    if listed and not all(_stored(store, i) for i in listed):
        # teacher.json is committed, tapes.db is not: on a fresh checkout the teacher runs again
        # (a program on fixed seeds) and must solve as many episodes as the record says.
        print("sft: the teacher's tapes are not in tapes.db (a fresh checkout): it runs again", flush=True)
        if record_file.exists():  # the first record stays the reference
            solved_file.unlink()
        else:
            solved_file.replace(record_file)
    recorded = json.loads(record_file.read_text()) if record_file.exists() else None
    if not solved_file.exists():
        tasks = [
            Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
            for t in SPLIT.train_tasks
            for s in SPLIT.train_seeds[: args.teacher_seeds]
        ]
        # the teacher acts at once on every page (no model to wait for): at 32 pages and
        # Playwright's 2 s wait for a clickable element, the 2-core VM of 2026-11-29 timed out
        # clicks and solved 84 and 170 of 224 (8 pages: 217); a slow click is the machine's, not
        # the teacher's, so it waits 10 s here (8 pages: 224 of 224)
        env = WebEnvironment(max_concurrent=args.teacher_concurrency, timeout_s=30, action_timeout_s=10.0)
        with env:
            report = evaluate(teacher_agent(), env, tasks, reward_scorer, name="teacher", store=store)
        store.flush()
        solved = [s.tape_id for s in report.samples if sample_reward(s) > 0 and s.tape_id in report.tapes]
        if recorded is not None and len(solved) != len(recorded["solved"]):
            said = (
                f"sft: the teacher solved {len(solved)} of {len(tasks)} episodes again, the record says "
                f"{len(recorded['solved'])}"
            )
            if not args.new_student:
                raise SystemExit(
                    f"{said}: the student would not be the one the study's figures are about "
                    "(--new-student trains it on these episodes; its figures must then be measured again)"
                )
            print(f"{said}; --new-student: the student is trained on these", flush=True)
        solved_file.write_text(json.dumps({"episodes": len(tasks), "solved": solved}) + "\n")
        log(out, "teacher", time.perf_counter() - started, episodes=len(tasks), solved=len(solved))
    ids = json.loads(solved_file.read_text())["solved"]
    dataset, dropped = student_sft_data(store, ids, model, tokenizer)
    config = sft_config(out / "sft", seed=0, max_steps=args.sft_steps, save_steps=5)
    began = time.perf_counter()
    train_sft(dataset, model, tokenizer=tokenizer, config=config)  # the student: sft/final
    kept = len(ids) - len(dropped)
    log(out, "sft", time.perf_counter() - began, steps=args.sft_steps, tapes=kept, dropped=dropped)
    store.close()


def stage_screen(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Each candidate's greedy validation success under the student, and the choice."""
    path = out / "screen.json"
    if path.exists():
        return json.loads(path.read_text())
    model, tokenizer = load(out / STUDENT)
    store = open_store(str(out / "tapes.db"))
    tasks = eval_tasks("validation", args.screen_seeds, CANDIDATES)
    started = time.perf_counter()
    with WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        report = evaluate_student(model, tokenizer, env, tasks, "screen", store)
    table = per_task(report)
    success = {t: sum(v.values()) / len(v) if v else None for t, v in table.items()}
    low, high = SCREEN_RANGE
    chosen = [t for t in CANDIDATES if success.get(t) is not None and low <= success[t] <= high]  # type: ignore[operator]
    result = {
        "seeds": args.screen_seeds,
        "range": SCREEN_RANGE,
        "success": success,
        "per_task": table,
        "chosen": chosen,
    }
    path.write_text(json.dumps(result, indent=1) + "\n")
    log(out, "screen", time.perf_counter() - started, episodes=len(tasks))
    store.close()
    print(f"screen: {json.dumps(success)}\nchosen: {chosen}", flush=True)
    return result


class Validation(StepCallback):
    """Scores the policy on the RL tasks' validation seeds every ``every`` steps (and at the
    last), appending to ``val.jsonl``; points already there (a resumed run) are not redone."""

    def __init__(self, run: Path, every: int, last: int, score: Any) -> None:
        self.path, self.every, self.last, self.score = run / "val.jsonl", every, last, score
        self.done = (
            {json.loads(line)["step"] for line in self.path.read_text().splitlines()}
            if self.path.exists()
            else set()
        )

    def on_step(self, record: StepRecord) -> bool | None:
        """Evaluate at the points; never stops the run."""
        step = record.step
        if step in self.done or (step % self.every and step != self.last):
            return None
        point = {"step": step, **self.score(step)}
        with self.path.open("a") as f:
            f.write(json.dumps(point) + "\n")
        self.done.add(step)
        print(f"  validation at step {step}: {point['success']:.3f}", flush=True)
        return None


def run_name(arm: str, seed: int) -> str:
    """The folder of training seed ``seed`` of ``arm`` (a named setting; ``""``: the study's
    first): ``rl-seed0``, ``rl-t07-seed0``."""
    if arm and not arm.replace("_", "").isalnum():
        raise SystemExit(f"--arm {arm!r}: letters, digits and _ only (it names folders)")
    return f"rl-{arm}-seed{seed}" if arm else f"rl-seed{seed}"


def stage_rl(args: argparse.Namespace, out: Path, seed: int) -> None:
    """GRPO from the student on the RL tasks, seed ``seed`` of ``--arm``; resumes from its last
    step."""
    import torch

    run = out / run_name(args.arm, seed)
    if (run / "final" / "config.json").exists():
        print(f"rl {run.name}: finished", flush=True)
        return
    run.mkdir(parents=True, exist_ok=True)
    tasks = list(TEACHERLESS_TASKS)
    if not tasks:
        raise SystemExit(
            "no RL tasks in the split yet: run `screen` and write its choice into TEACHERLESS_TASKS"
        )
    torch.manual_seed(seed)
    check_student(run, student_id(out))
    model, tokenizer = load(out / STUDENT)
    store = open_store(str(out / "tapes.db"))
    val = eval_tasks("validation", args.val_seeds, tasks)
    started = time.perf_counter()
    with WebEnvironment(max_concurrent=32, timeout_s=30) as env:

        def score(step: int) -> dict[str, Any]:
            report = evaluate_student(model, tokenizer, env, val, f"{run.name}-val{step}", store)
            table = per_task(report)
            return {"success": success(table), "per_task": table}

        setup = rl_setup(env, tasks, seed, args.rl_seeds)
        config = rl_config(
            run,
            seed=seed,
            steps=args.steps,
            lr=args.lr,
            temperature=args.temperature,
            kl_coef=args.kl_coef,
            group_key=args.group_key,
            tasks_per_step=args.tasks_per_step,
            group_size=args.group_size,
            resample_rounds=args.resample_rounds,
        )
        train_rl(
            setup,
            model,
            tokenizer,
            config,
            store=store,
            callbacks=[Validation(run, args.eval_every, args.steps, score)],
        )
    model.save_pretrained(run / "final")
    tokenizer.save_pretrained(run / "final")
    settings = {"lr": args.lr, "temperature": args.temperature, "kl": args.kl_coef}
    log(out, run.name, time.perf_counter() - started, steps=args.steps, **settings)
    store.close()


def stage_test(args: argparse.Namespace, out: Path) -> None:
    """The student and every finished seed on the test seeds, each evaluated once: greedy on the
    RL tasks and the teacher tasks (``per_task``), then one sample at T = 1 on the same episodes
    (``sampled``; added before any test episode ran, once validation had shown the greedy
    policy repeating actions that sampling varies). Which of the two is a policy's primary
    figure is chosen on validation (docs/experiments/web-teacherless.md; the plot script)."""
    import torch

    path = out / "test.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    policies = {"student": out / STUDENT}
    policies.update(
        {d.name: d / "final" for d in sorted(out.glob("rl-*seed*")) if (d / "final" / "config.json").exists()}
    )
    todo = {name: where for name, where in policies.items() if "sampled" not in results.get(name, {})}
    if not todo:
        print("test: every policy is evaluated", flush=True)
        return
    rl_tasks = eval_tasks("test", args.test_seeds, TEACHERLESS_TASKS)
    tasks = rl_tasks + eval_tasks("test", args.forgetting_seeds)
    store = open_store(str(out / "tapes.db"))
    with WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        for name, where in todo.items():
            model, tokenizer = load(where)
            if name not in results:
                started = time.perf_counter()
                report = evaluate_student(model, tokenizer, env, tasks, f"test-{name}", store)
                results[name] = {
                    "student": student_id(out) if name == "student" else started_from(out / name),
                    "per_task": per_task(report),
                    "environment_failures": report.n_environment_failures,
                }
                path.write_text(json.dumps(results, indent=1) + "\n")
                log(out, f"test-{name}", time.perf_counter() - started, episodes=len(tasks))
            started = time.perf_counter()
            torch.manual_seed(0)
            sampled = evaluate_student(
                model, tokenizer, env, tasks, f"test-{name}-t1", store, temperature=1.0
            )
            results[name]["sampled"] = per_task(sampled)
            results[name]["sampled_environment_failures"] = sampled.n_environment_failures
            path.write_text(json.dumps(results, indent=1) + "\n")
            log(out, f"test-{name}-t1", time.perf_counter() - started, episodes=len(tasks))
            print(f"test: {name} done", flush=True)
    store.close()


def stage_probe(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """A finished policy (``--policy``: ``student`` or a seed's run, e.g. ``rl-seed0``) on the RL
    tasks' validation seeds at ``--temperature``, one line of ``probe.jsonl`` (validation only:
    what a setting is chosen on)."""
    import torch

    where = out / STUDENT if args.policy == "student" else out / args.policy / "final"
    if not (where / "config.json").exists():
        raise SystemExit(f"probe: no finished policy at {where}")
    model, tokenizer = load(where)
    store = open_store(str(out / "tapes.db"))
    tasks = eval_tasks("validation", args.val_seeds, TEACHERLESS_TASKS)
    started = time.perf_counter()
    torch.manual_seed(0)
    name = f"probe-{args.policy}-t{args.probe_temperature:g}"
    with WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        report = evaluate_student(
            model, tokenizer, env, tasks, name, store, temperature=args.probe_temperature
        )
    table = per_task(report)
    point = {
        "policy": args.policy,
        "student": student_id(out) if args.policy == "student" else started_from(out / args.policy),
        "temperature": args.probe_temperature,
        "success": success(table),
        "per_task": table,
    }
    with (out / "probe.jsonl").open("a") as f:
        f.write(json.dumps(point) + "\n")
    log(out, name, time.perf_counter() - started, episodes=len(tasks))
    store.close()
    print(f"probe {name}: {point['success']:.3f}", flush=True)
    return point


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["sft", "screen", "rl", "test", "probe", "all"])
    p.add_argument("--out", default="runs/teacherless")
    p.add_argument("--seed", type=int, default=0, help="rl: the training seed")
    p.add_argument(
        "--arm", default="", help="rl: a name for a changed setting (folders rl-ARM-seedS; default: rl-seedS)"
    )
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="all: the training seeds")
    p.add_argument("--teacher-seeds", type=int, default=16)
    p.add_argument("--teacher-concurrency", type=int, default=8, help="sft: pages the teacher drives at once")
    p.add_argument(
        "--new-student",
        action="store_true",
        help="sft: train a new student when the teacher, run again, solves another number of episodes",
    )
    p.add_argument("--sft-steps", type=int, default=24)
    p.add_argument("--screen-seeds", type=int, default=20)
    p.add_argument("--rl-seeds", type=int, default=64, help="training seeds per RL task in the pool")
    p.add_argument("--val-seeds", type=int, default=20)
    p.add_argument("--test-seeds", type=int, default=40, help="test seeds per RL task")
    p.add_argument("--forgetting-seeds", type=int, default=20, help="test seeds per teacher task")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--tasks-per-step", type=int, default=16, help="rl: pages (task, seed) per step")
    p.add_argument("--group-size", type=int, default=2, help="rl: attempts at each page")
    p.add_argument(
        "--group-key",
        choices=["category", "task_id"],
        default="category",
        help="rl: compare the rewards of a step's attempts at one task (category) or one page (task_id)",
    )
    p.add_argument(
        "--resample-rounds",
        type=int,
        default=0,
        help="rl (--group-key task_id): up to this many more rounds for pages whose attempts all agree",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--policy", default="student", help="probe: student or a finished seed's run (rl-seed0)")
    p.add_argument(
        "--probe-temperature", type=float, default=1.0, help="probe: the sampling temperature (0: greedy)"
    )
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ignore = out / ".gitignore"  # the logs are committed; weights, checkpoints and tapes are not
    if not ignore.exists():
        ignore.write_text(
            "sft/checkpoint-*/\nsft/final/*\n!sft/final/tapekit_train.json\n"
            "rl-*/ckpt-*/\nrl-*/.ckpt-*\nrl-*/final/\nrl-*/latest.json\n*.db*\n"
        )
    if args.stage in ("sft", "all"):
        stage_sft(args, out)
    if args.stage in ("screen", "all"):
        stage_screen(args, out)
    if args.stage == "rl":
        stage_rl(args, out, args.seed)
    if args.stage == "all":
        for seed in args.seeds:
            stage_rl(args, out, seed)
    if args.stage in ("test", "all"):
        stage_test(args, out)
    if args.stage == "probe":
        stage_probe(args, out)


if __name__ == "__main__":
    main()
