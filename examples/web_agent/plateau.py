"""SFT to its plateau, then the same extra compute on more SFT or on GRPO: the web study's
question (docs/experiments/web-training.md) asked where 2507.04103 asks it.

The 360 s study branched to GRPO 4-5 SFT steps in, while SFT was still climbing; this one
trains SFT until validation stops rising and only then compares what the same extra compute
buys. Every stage writes under ``--out`` and continues where it stopped when run again:

    python examples/web_agent/plateau.py teacher     # the teacher's episodes (SFT pool + fresh pool)
    python examples/web_agent/plateau.py sft         # SFT until validation has not risen for 3 evaluations
    python examples/web_agent/plateau.py grid        # GRPO's learning rate x temperature, on validation
    python examples/web_agent/plateau.py arm --arm grpo --seed 0     # GRPO from the plateau (also grpo_kl)
    python examples/web_agent/plateau.py arm --arm sft --seed 0      # more SFT, the grpo run's CPU seconds
    python examples/web_agent/plateau.py test        # once, for the final runs: every policy on fresh seeds

- ``teacher``: the programmatic teacher on ``--teacher-seeds`` training seeds of each of the 14
  tasks (the SFT pool; at least ``MIN_SOLVED`` solved per task, or the stage stops and says
  which task is short) and ``--fresh-seeds`` more (the ``sft`` arm's fresh episodes, never in
  the SFT pool). Its wall seconds are charged once (the teacher is a program): the table also
  prices its tokens as a 70B-class model would (:data:`TEACHER_LLM_FLOPS_PER_TOKEN`).
- ``sft``: SFT from the base model (8 packed rows a step, learning rate ``--sft-lr``: 2e-4 with
  LoRA, 5e-5 for full fine-tuning, as the web study),
  validation every ``--eval-every`` steps on ``--val-seeds`` validation seeds of each task
  (greedy); it stops when the best validation success has not risen for ``--patience``
  evaluations, or at ``--sft-max-steps``. The plateau is the best evaluation's weights
  (``OUT/plateau``); ``sft/val.jsonl`` has every evaluation.
- ``grid``: GRPO from the plateau for ``--grid-steps`` updates at each learning rate of
  :data:`LR_GRID` and temperature of :data:`TEMP_GRID` (training seed 0), each scored on the
  validation seeds; ``grid.json`` keeps every score and the choice (the best; a tie goes to the
  smaller learning rate, then the lower temperature).
- ``arm --arm grpo|grpo_kl --seed S``: GRPO from the plateau with the grid's choice,
  ``--rl-steps`` updates (zero-advantage groups carry no gradient and are dropped from the
  update, as ``train_rl`` always does), the rewards compared within each task (``group_key
  "category"``: the student's attempts at one page nearly always agree), a checkpoint after
  every update; ``grpo_kl`` adds a k3 KL term to the plateau policy (``--kl-coef``).
  Validation ``--arm-evals`` times, evenly spaced (at 25 and 50 updates by default).
- ``arm --arm sft --seed S``: more SFT from the plateau on the SFT pool and the fresh episodes,
  until its charged seconds reach those of ``grpo-seedS`` (the grpo run must be finished; both
  runs' FLOPs are in their ledgers, counted as the paper does: 6 N per trained token, 2 N per
  rolled-out token). Validation ``--arm-evals`` times, at even fractions of its budget.
- ``test``: the plateau and every finished arm, greedy, once each, on the test seeds
  :data:`TEST_SEEDS` of the 14 tasks (never evaluated by any earlier study) and the same seeds
  of the held-out tasks; ``test.json`` keeps each policy's episodes.

Every model is trained as a LoRA adapter (``--lora-r``, 16 by default; 0 is full fine-tuning,
the first run's setting) in fp32: the plateau and each arm's final policy are adapters of 20 MB,
committed with the logs, so that a stage run on a new machine starts from the very branch
point and tests the very policies trained (a full model is 540 MB, and CPU training is not
bit-reproducible, so a lost one cannot be rebuilt). The branch point
is the base model with that adapter merged in; each arm trains a new adapter on top of it (the
KL term's reference is the branch point). The teacher's episodes, as the student's training
samples, are committed too (``teacher-samples.jsonl.gz``), and the GRPO runs' journals replay
on a new machine (``rl_config``).

Wall seconds of every stage go to ``OUT/ledger.jsonl``; each run's own spending (seconds,
FLOPs, tokens) to its ``ledger.jsonl``; tapes to ``OUT/tapes.db``. The write-up is
docs/experiments/web-plateau.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.web_agent.study import (
    Ledger,
    Settings,
    evaluate_student,
    load_student,
    sample_reward,
)
from examples.web_agent.teacherless import (
    _stored,
    load,
    log,
    per_task,
    rl_config,
    rl_setup,
    sft_config,
    student_sft_data,
    success,
)
from tapekit import evaluate, open_store
from tapekit.evaluate import Task
from tapekit.training import (
    LoraSettings,
    StepCallback,
    StepRecord,
    train_rl,
    train_sft,
)
from tapekit.web import (
    SPLIT,
    WebEnvironment,
    eval_tasks,
    reward_scorer,
    start_tape,
    teacher_agent,
)

MIN_SOLVED = 32
"""Solved teacher episodes per task in the SFT pool: below it SFT would be data-starved."""

LR_GRID: tuple[float, ...] = (1e-5, 3e-5)
"""GRPO's learning rates for the grid, full fine-tuning (``--lora-r 0``)."""
LORA_LR_GRID: tuple[float, ...] = (3e-5, 1e-4)
"""GRPO's learning rates for the grid with LoRA (the sweep, docs/experiments/grpo-sweep.md,
found 1e-4 best and 5e-4 too high for a LoRA student)."""
TEMP_GRID: tuple[float, ...] = (0.7, 1.0)
SFT_LR, LORA_SFT_LR = 5e-5, 2e-4
"""SFT's constant learning rate: full fine-tuning (the web study's), and LoRA."""
DTYPE = "float32"
"""Every stage trains in fp32, whatever the CPU: dtype ``auto`` would be bf16 autocast on one
with avx512_bf16 and fp32 on one without, and the study's runs span machines of both kinds."""
LORA_ALPHA = 32
"""LoRA's scale (``alpha``, with ``--lora-r`` 16: the library's default adapter)."""
TEST_SEEDS = SPLIT.test_seeds[40:60]
"""The split's test seeds 200,040-200,059, added for this study: no study before it evaluated
them (the earlier ones used the first 40)."""

TEACHER_LLM_FLOPS_PER_TOKEN = 2 * 70e9
"""What a 70B-class teacher would spend per token it reads or writes (2 N): the teacher's
second price in the table, on the tokens of its episodes as the student's tokenizer counts them."""

MAX_TOKENS = Settings.max_tokens
PLATEAU = "plateau"


def save(model: Any, tokenizer: Any, path: Path) -> None:
    """Weights and tokenizer to ``path``, replacing what was there: written beside it
    (``.part``), then swapped in by renames, so a kill leaves either model whole (see
    :func:`ready`)."""
    part, old = path.with_name(path.name + ".part"), path.with_name(path.name + ".old")
    shutil.rmtree(part, ignore_errors=True)
    model.save_pretrained(part)
    tokenizer.save_pretrained(part)
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    part.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def _weights(path: Path) -> bool:
    """A saved model (``config.json``) or LoRA adapter (``adapter_config.json``) is at ``path``."""
    return (path / "config.json").exists() or (path / "adapter_config.json").exists()


def ready(path: Path) -> bool:
    """Whether a whole model or adapter is at ``path``, finishing a :func:`save` a kill cut
    between its renames."""
    part = path.with_name(path.name + ".part")
    if not path.exists() and _weights(part) and (part / "tokenizer_config.json").exists():
        part.rename(path)
    return _weights(path)


def adapted(model: Any, args: argparse.Namespace, seed: int) -> Any:
    """``model`` with a new LoRA adapter of rank ``--lora-r`` (its initial weights drawn from
    ``seed``), or ``model`` itself when ``--lora-r`` is 0 (full fine-tuning). The trainers get
    the adapted model as it is (their own ``lora`` setting is off), so the stage holds the
    model it trains and saves: an adapter directory with LoRA, a full model without."""
    if not args.lora_r:
        return model
    import torch
    from peft import get_peft_model

    torch.manual_seed(seed)
    return get_peft_model(model, LoraSettings(r=args.lora_r, alpha=LORA_ALPHA).peft_config())


def load_branch(out: Path) -> tuple[Any, Any]:
    """The branch point in fp32: the plateau's full model, or the base model with the
    plateau's LoRA adapter merged in (the arms put a new adapter on top of it)."""
    where = out / PLATEAU
    if not ready(where):
        raise SystemExit(
            f"{where}: the plateau's weights are not here (run the `sft` stage; a full-fine-tuning "
            "plateau is not committed, so a new machine cannot rebuild it)"
        )
    return _merged(load_student(), where) if (where / "adapter_config.json").exists() else load(where)


def _merged(loaded: tuple[Any, Any], adapter: Path) -> tuple[Any, Any]:
    """The model of ``loaded`` with the LoRA adapter at ``adapter`` merged in, and its tokenizer."""
    from peft import PeftModel

    model, tokenizer = loaded
    return PeftModel.from_pretrained(model, adapter).merge_and_unload(), tokenizer


def load_policy(out: Path, where: Path) -> tuple[Any, Any]:
    """A policy to test: the branch point, an arm's full model, or an arm's adapter on the
    branch point."""
    if where == out / PLATEAU:
        return load_branch(out)
    return _merged(load_branch(out), where) if (where / "adapter_config.json").exists() else load(where)


def validate(
    model: Any, tokenizer: Any, env: WebEnvironment, args: argparse.Namespace, name: str, store: Any
) -> dict[str, Any]:
    """Greedy success on the validation seeds (``--val-seeds`` of each of the 14 tasks)."""
    tasks = eval_tasks("validation", args.val_seeds, args.tasks)
    report = evaluate_student(model, tokenizer, env, tasks, name, store)
    table = per_task(report)
    return {"success": success(table), "per_task": table}


def web(args: argparse.Namespace) -> WebEnvironment:
    """The study's browser: ``--pages`` episodes at once, ``--action-timeout`` seconds a click,
    fill or key press. On a 2-core machine 32 pages at once starve the browser: the second run's
    teacher, at 32 pages and 2 s, solved 440 of 840 episodes where the first VM's solved 598, its
    failures clicks that timed out (Locator.click: Timeout 2000ms), not wrong clicks."""
    return WebEnvironment(max_concurrent=args.pages, action_timeout_s=args.action_timeout, timeout_s=30)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it is missing)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def resumed_step(run: Path) -> int:
    """The step a run resumes from: its last checkpoint (SFT's ``checkpoint-N``, GRPO's
    ``ckpt-N``), 0 for none."""
    steps = [
        int(d.name.rsplit("-", 1)[1]) for d in run.glob("*-*") if d.name.startswith(("checkpoint-", "ckpt-"))
    ]
    return max(steps, default=0)


def run_ledger(path: Path, model: Any) -> Ledger:
    """A run's :class:`Ledger`, resumed: the lines of steps after the run's last checkpoint (done
    again now) are dropped, and the totals are the last kept line's."""
    ledger = Ledger(path, model.num_parameters())
    upto = resumed_step(path.parent)
    lines = [line for line in read_lines(path) if int(line["stage"].rsplit("-", 1)[1]) <= upto]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    if lines:
        last = lines[-1]
        ledger.seconds, ledger.flops = float(last["seconds"]), float(last["flops"])
        ledger.trained_tokens, ledger.rollout_tokens = (
            int(last["trained_tokens"]),
            int(last["rollout_tokens"]),
        )
        ledger.episodes = int(last["episodes"])
    return ledger


# --- teacher ------------------------------------------------------------------------------


def stage_teacher(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The teacher's solved episodes: the SFT pool and the fresh pool (``teacher.json``)."""
    path = out / "teacher.json"
    if path.exists():
        return json.loads(path.read_text())
    n = args.teacher_seeds + args.fresh_seeds
    tasks = [
        Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
        for t in args.tasks
        for s in SPLIT.train_seeds[:n]
    ]
    store = open_store(str(out / "tapes.db"))
    started = time.perf_counter()
    with web(args) as env:
        report = evaluate(teacher_agent(), env, tasks, reward_scorer, name="teacher", store=store)
    store.flush()
    pools: dict[str, list[str]] = {"sft": [], "fresh": []}
    solved: dict[str, int] = {}
    for sample in report.samples:
        task, seed = sample.task_id.rsplit("/", 1)
        if sample_reward(sample) <= 0 or sample.tape_id not in report.tapes:
            continue
        pool = "sft" if int(seed) < args.teacher_seeds else "fresh"
        pools[pool].append(sample.tape_id)
        solved[task] = solved.get(task, 0) + (pool == "sft")
    short = {t: solved.get(t, 0) for t in args.tasks if solved.get(t, 0) < args.min_solved}
    result = {"episodes": len(tasks), "solved_per_task": solved, **pools}
    log(out, "teacher", time.perf_counter() - started, episodes=len(tasks), solved=len(pools["sft"]))
    store.close()
    if short:
        raise SystemExit(
            f"teacher: fewer than {args.min_solved} solved SFT episodes for {short}: raise --teacher-seeds"
        )
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


SAMPLES = "teacher-samples.jsonl.gz"
"""The teacher's episodes as the student's training samples (token ids and loss masks), both
pools: written once from the tapes and committed, so a later stage on a new machine (the
``sft`` arm) trains on the very samples the plateau did, without the tapes."""


def teacher_samples(args: argparse.Namespace, out: Path, tokenizer: Any) -> dict[str, list[dict[str, Any]]]:
    """``{"sft": rows, "fresh": rows}``: the training rows of the two pools, read from
    ``OUT/teacher-samples.jsonl.gz``, or made from the stored teacher tapes (and written there)."""
    import gzip

    path = out / SAMPLES
    if not path.exists():
        teacher = stage_teacher(args, out)
        store = open_store(str(out / "tapes.db"))
        student = load_student()[0]  # only its agent's prompt format is used, not its weights
        made = {}
        for pool in ("sft", "fresh"):
            ids = teacher[pool]
            if not all(_stored(store, i) for i in ids):
                raise SystemExit(
                    f"{out / 'tapes.db'}: the teacher's tapes are gone and {SAMPLES} was never "
                    "written: move teacher.json aside and run the teacher stage again"
                )
            dataset, _ = student_sft_data(store, ids, student, tokenizer)
            made[pool] = [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in dataset]
        store.close()
        part = path.with_name(path.name + ".part")
        with gzip.open(part, "wt") as f:
            for pool, rows in made.items():
                for row in rows:
                    f.write(json.dumps({"pool": pool, **row}) + "\n")
        part.rename(path)
    pools: dict[str, list[dict[str, Any]]] = {"sft": [], "fresh": []}
    with gzip.open(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            pools[row.pop("pool")].append(row)
    return pools


class Charge(StepCallback):
    """Charges each training step to a run's :class:`Ledger` (wall seconds since the last step,
    evaluations excluded; SFT: the input tokens seen; RL: trained and rolled-out tokens)."""

    def __init__(self, ledger: Ledger, stage: str) -> None:
        self.ledger, self.stage = ledger, stage
        self.last = time.perf_counter()
        self.tokens_seen = ledger.trained_tokens  # SFT counts input tokens from the run's start, resumed too
        self.paused = 0.0

    def on_step(self, record: StepRecord) -> bool | None:
        """Charge the step."""
        now = time.perf_counter()
        seconds, self.last, self.paused = now - self.last - self.paused, now, 0.0
        if record.trainer == "rl":
            m = record.metrics
            self.ledger.add(
                f"{self.stage}-{record.step}",
                seconds,
                trained=int(m["train_input_tokens"]),
                rolled=int(m["rollout_prompt_tokens"]) + int(m["rollout_output_tokens"]),
                episodes=int(m["rollouts"]),
            )
        else:
            seen = int(record.tokens or self.tokens_seen)
            self.ledger.add(f"{self.stage}-{record.step}", seconds, trained=max(seen - self.tokens_seen, 0))
            self.tokens_seen = seen
        return None

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (an evaluation between steps) out of the next step's charge."""
        self.paused += seconds


class Evaluations(StepCallback):
    """Validation at the points ``due(step, ledger)`` says, one line each in ``val.jsonl`` (a
    resumed run neither repeats nor skips a point); ``then(point)`` may stop the run."""

    def __init__(
        self,
        path: Path,
        due: Callable[[StepRecord], bool],
        score: Callable[[int], dict[str, Any]],
        charge: Charge | None = None,
        then: Callable[[dict[str, Any]], bool] = lambda point: False,
    ) -> None:
        self.path, self.due, self.score, self.charge, self.then = path, due, score, charge, then
        self.done = {p["step"] for p in read_lines(path)}

    def on_step(self, record: StepRecord) -> bool | None:
        """Evaluate when due; ``True`` when ``then`` says stop."""
        if record.step in self.done or not self.due(record):
            return None
        began = time.perf_counter()
        point = {"step": record.step, **self.score(record.step)}
        with self.path.open("a") as f:
            f.write(json.dumps(point) + "\n")
        self.done.add(record.step)
        if self.charge is not None:
            self.charge.pause(time.perf_counter() - began)
        print(f"  validation at step {record.step}: {point['success']:.3f}", flush=True)
        return self.then(point) or None


def plateau_reached(points: list[dict[str, Any]], patience: int) -> bool:
    """Validation has not risen above its best for ``patience`` evaluations."""
    if not points:
        return False
    values = [p["success"] for p in points]
    best = max(range(len(values)), key=lambda i: (values[i], -i))  # the first time the best was reached
    return len(values) - 1 - best >= patience


# --- sft to the plateau --------------------------------------------------------------------


def stage_sft(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """SFT from the base model until the plateau; the best evaluation's weights in ``OUT/plateau``."""
    run = out / "sft"
    done = run / "plateau.json"
    if done.exists():
        return json.loads(done.read_text())
    run.mkdir(parents=True, exist_ok=True)
    val_path = run / "val.jsonl"
    model, tokenizer = load_student()
    rows = teacher_samples(args, out, tokenizer)
    model = adapted(model, args, seed=0)
    store = open_store(str(out / "tapes.db"))
    ledger = run_ledger(run / "ledger.jsonl", model)
    started = time.perf_counter()
    with web(args) as env:
        if not read_lines(val_path):  # the base model is the curve's first point
            point = {"step": 0, **validate(model, tokenizer, env, args, "sft-val0", store)}
            val_path.write_text(json.dumps(point) + "\n")

        def score(step: int) -> dict[str, Any]:
            result = validate(model, tokenizer, env, args, f"sft-val{step}", store)
            points = read_lines(val_path)
            if result["success"] > max(p["success"] for p in points):
                save(model, tokenizer, out / PLATEAU)  # the best so far
            return result

        charge = Charge(ledger, "sft")
        evals = Evaluations(
            val_path,
            lambda r: r.step % args.eval_every == 0,
            score,
            charge,
            then=lambda _: plateau_reached(read_lines(val_path), args.patience),
        )
        if not plateau_reached(read_lines(val_path), args.patience):
            config = sft_config(run, seed=0, max_steps=args.sft_max_steps, save_steps=args.eval_every)
            config = config.model_copy(update={"learning_rate": args.sft_lr, "dtype": DTYPE})
            train_sft(rows["sft"], model, tokenizer=tokenizer, config=config, callbacks=[charge, evals])
    points = read_lines(val_path)
    best = max(points, key=lambda p: (p["success"], -p["step"]))
    if not ready(out / PLATEAU):  # the base model was never beaten (with LoRA: a zero adapter)
        base, tokenizer = load_student()
        save(adapted(base, args, seed=0), tokenizer, out / PLATEAU)
    result = {
        "step": best["step"],
        "success": best["success"],
        "evaluations": len(points),
        "stopped_at": points[-1]["step"],
        "plateau": plateau_reached(points, args.patience),
        "flops": ledger.flops,
        "seconds": ledger.seconds,
    }
    done.write_text(json.dumps(result, indent=1) + "\n")
    # the stage's wall seconds this time; the run's charged seconds (all sittings) as "charged"
    more = {k: v for k, v in result.items() if k != "seconds"}
    log(out, "sft", time.perf_counter() - started, **more, charged_seconds=result["seconds"])
    store.close()
    return result


# --- GRPO from the plateau -----------------------------------------------------------------


def grpo_run(
    args: argparse.Namespace,
    out: Path,
    run: Path,
    *,
    seed: int,
    steps: int,
    lr: float,
    temperature: float,
    kl_coef: float,
    eval_every: int,
) -> dict[str, Any]:
    """GRPO from the plateau into ``run`` (resumes from its last update); the final weights in
    ``run/final`` and the last validation point."""
    import torch

    if ready(run / "final"):
        return read_lines(run / "val.jsonl")[-1]
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model, tokenizer = load_branch(out)
    model = adapted(model, args, seed=seed)
    store = open_store(str(out / "tapes.db"))
    ledger = run_ledger(run / "ledger.jsonl", model)
    started = time.perf_counter()
    with web(args) as env:
        charge = Charge(ledger, run.name)
        evals = Evaluations(
            run / "val.jsonl",
            lambda r: r.step % eval_every == 0 or r.step == steps,
            lambda step: validate(model, tokenizer, env, args, f"{run.name}-val{step}", store),
            charge,
        )
        setup = rl_setup(env, args.tasks, seed, args.rl_seeds)
        config = rl_config(
            run,
            seed=seed,
            steps=steps,
            lr=lr,
            temperature=temperature,
            kl_coef=kl_coef,
            group_key="category",
            tasks_per_step=args.tasks_per_step,
            group_size=args.group_size,
        ).model_copy(update={"dtype": DTYPE})
        train_rl(setup, model, tokenizer, config, store=store, callbacks=[charge, evals])
    save(model, tokenizer, run / "final")
    log(out, run.name, time.perf_counter() - started, steps=steps, lr=lr, temperature=temperature, kl=kl_coef)
    store.close()
    return read_lines(run / "val.jsonl")[-1]


def stage_grid(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Short GRPO runs over the learning rates and temperatures; the best on validation."""
    path = out / "grid.json"
    if path.exists():
        return json.loads(path.read_text())
    stage_sft(args, out)
    scores = []
    for lr in args.grid_lr:
        for temperature in args.grid_temp:
            run = out / "grid" / f"lr{lr:g}-t{temperature:g}"
            done = [p for p in read_lines(run / "val.jsonl") if p["step"] == args.grid_steps]
            # a finished grid run is its score (its weights are not kept: not committed)
            point = (
                done[-1]
                if done
                else grpo_run(
                    args,
                    out,
                    run,
                    seed=0,
                    steps=args.grid_steps,
                    lr=lr,
                    temperature=temperature,
                    kl_coef=0.0,
                    eval_every=args.grid_steps,
                )
            )
            scores.append({"lr": lr, "temperature": temperature, "success": point["success"]})
    best = max(scores, key=lambda s: (s["success"], -s["lr"], -s["temperature"]))
    result = {"steps": args.grid_steps, "scores": scores, "choice": best}
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def stage_arm(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One arm and training seed from the plateau."""
    choice = stage_grid(args, out)["choice"]
    run = out / f"{args.arm}-seed{args.seed}"
    if args.arm in ("grpo", "grpo_kl"):
        return grpo_run(
            args,
            out,
            run,
            seed=args.seed,
            steps=args.rl_steps,
            lr=choice["lr"],
            temperature=choice["temperature"],
            kl_coef=args.kl_coef if args.arm == "grpo_kl" else 0.0,
            eval_every=max(1, args.rl_steps // args.arm_evals),
        )
    return sft_arm(args, out, run)


def sft_arm(args: argparse.Namespace, out: Path, run: Path) -> dict[str, Any]:
    """More SFT from the plateau on the SFT pool and the fresh episodes, for the charged seconds
    of ``grpo-seedS`` (its ledger's last line)."""
    if ready(run / "final"):
        return read_lines(run / "val.jsonl")[-1]
    target_ledger = out / f"grpo-seed{args.seed}" / "ledger.jsonl"
    if not ready(out / f"grpo-seed{args.seed}" / "final"):
        raise SystemExit(
            f"arm sft --seed {args.seed}: run `arm --arm grpo --seed {args.seed}` first (its budget)"
        )
    budget = float(read_lines(target_ledger)[-1]["seconds"])
    run.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_branch(out)
    rows = teacher_samples(args, out, tokenizer)
    model = adapted(model, args, seed=args.seed)
    store = open_store(str(out / "tapes.db"))
    ledger = run_ledger(run / "ledger.jsonl", model)
    marks = [budget * q / args.arm_evals for q in range(1, args.arm_evals + 1)]
    started = time.perf_counter()
    with web(args) as env:
        charge = Charge(ledger, run.name)

        def due(record: StepRecord) -> bool:
            passed = sum(ledger.seconds >= q for q in marks)
            return passed > len(read_lines(run / "val.jsonl"))

        evals = Evaluations(
            run / "val.jsonl",
            due,
            lambda step: validate(model, tokenizer, env, args, f"{run.name}-val{step}", store),
            charge,
            then=lambda _: ledger.seconds >= budget,
        )
        config = sft_config(run, seed=args.seed, max_steps=100_000, save_steps=4)
        config = config.model_copy(update={"learning_rate": args.sft_lr, "dtype": DTYPE})
        train_sft(
            rows["sft"] + rows["fresh"], model, tokenizer=tokenizer, config=config, callbacks=[charge, evals]
        )
    save(model, tokenizer, run / "final")
    log(out, run.name, time.perf_counter() - started, budget_seconds=budget, flops=ledger.flops)
    store.close()
    return read_lines(run / "val.jsonl")[-1]


# --- test ----------------------------------------------------------------------------------


def stage_test(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The plateau and every finished arm, greedy, once each, on the fresh test seeds."""
    path = out / "test.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    policies = {PLATEAU: out / PLATEAU}
    for d in sorted(out.glob("*-seed*")):
        if ready(d / "final"):
            policies[d.name] = d / "final"
    todo = {name: where for name, where in policies.items() if name not in results}
    seeds = TEST_SEEDS[: args.test_seeds]
    tasks = eval_tasks(tasks=args.tasks, seeds=seeds) + eval_tasks(tasks=args.held_out, seeds=seeds)
    store = open_store(str(out / "tapes.db"))
    with web(args) as env:
        for name, where in todo.items():
            started = time.perf_counter()
            model, tokenizer = load_policy(out, where)
            report = evaluate_student(model, tokenizer, env, tasks, f"test-{name}", store)
            results[name] = {
                "per_task": per_task(report),
                "environment_failures": report.n_environment_failures,
            }
            path.write_text(json.dumps(results, indent=1) + "\n")
            log(out, f"test-{name}", time.perf_counter() - started, episodes=len(tasks))
    store.close()
    return results


def gitignore(*, lora: bool) -> str:
    """The ``.gitignore`` of a study's folder: the logs are committed; tapes, checkpoints and the
    grid's weights are not. With LoRA the plateau's and the arms' final adapters are committed
    (20 MB each at rank 16): a new machine starts the arms from the plateau and tests the arms'
    final policies. Full models (540 MB each) are not."""
    weights = "" if lora else "plateau/\n*/final/\n"
    return (
        "*.db*\nplateau.part/\nplateau.old/\n" + weights + "*/checkpoint-*/\n*/ckpt-*/\n*/.ckpt-*\n"
        "*/latest.json\n*/final.part/\nsft/final/\ngrid/*/ckpt-*/\ngrid/*/.ckpt-*\ngrid/*/latest.json\n"
        "grid/*/final/\n"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["teacher", "sft", "grid", "arm", "test"])
    p.add_argument("--out", default="runs/plateau")
    p.add_argument("--arm", choices=["grpo", "grpo_kl", "sft"], default="grpo")
    p.add_argument("--seed", type=int, default=0, help="arm: the training seed")
    p.add_argument("--teacher-seeds", type=int, default=36, help="training seeds per task in the SFT pool")
    p.add_argument("--fresh-seeds", type=int, default=16, help="more seeds per task, for the sft arm only")
    p.add_argument("--val-seeds", type=int, default=10, help="validation seeds per task")
    p.add_argument("--eval-every", type=int, default=8, help="sft: SFT steps between validations")
    p.add_argument("--patience", type=int, default=3, help="sft: evaluations without a rise = the plateau")
    p.add_argument("--sft-max-steps", type=int, default=160)
    p.add_argument("--grid-steps", type=int, default=12)
    p.add_argument(
        "--rl-steps", type=int, default=50, help="arm: GRPO updates (the protocol's first plan: 100)"
    )
    p.add_argument(
        "--arm-evals", type=int, default=2, help="arm: validations, evenly spaced (the first plan: 4)"
    )
    p.add_argument("--rl-seeds", type=int, default=64, help="training seeds per task in each GRPO pool")
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pages", type=int, default=8, help="browser pages at once (the first run: 32)")
    p.add_argument("--action-timeout", type=float, default=5.0, help="seconds per action (first run: 2)")
    p.add_argument("--tasks", nargs="+", default=list(SPLIT.train_tasks), help="the tasks (default: the 14)")
    p.add_argument("--held-out", nargs="*", default=list(SPLIT.held_out_tasks), help="test: held-out tasks")
    p.add_argument("--min-solved", type=int, default=MIN_SOLVED, help="teacher: solved SFT episodes per task")
    p.add_argument(
        "--lora-r",
        type=int,
        default=16,
        help="LoRA rank of every trained model (0: full fine-tuning, the first run's setting)",
    )
    p.add_argument(
        "--sft-lr", type=float, default=None, help=f"default {LORA_SFT_LR} with LoRA, {SFT_LR} without"
    )
    p.add_argument("--grid-lr", type=float, nargs="+", default=None, help="default LORA_LR_GRID or LR_GRID")
    p.add_argument("--grid-temp", type=float, nargs="+", default=list(TEMP_GRID))
    p.add_argument("--test-seeds", type=int, default=len(TEST_SEEDS), help="test: the first N of TEST_SEEDS")
    args = p.parse_args(argv)
    if args.arm_evals < 1 or args.rl_steps < 1:
        p.error(f"--arm-evals and --rl-steps must be >= 1, not {args.arm_evals} and {args.rl_steps}")
    if args.lora_r < 0:
        p.error(f"--lora-r must be 0 (full fine-tuning) or a rank >= 1, not {args.lora_r}")
    if args.sft_lr is None:
        args.sft_lr = LORA_SFT_LR if args.lora_r else SFT_LR
    if args.grid_lr is None:
        args.grid_lr = list(LORA_LR_GRID if args.lora_r else LR_GRID)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ignore = out / ".gitignore"
    if not ignore.exists():
        ignore.write_text(gitignore(lora=bool(args.lora_r)))
    stages: dict[str, Callable[[argparse.Namespace, Path], Any]] = {
        "teacher": stage_teacher,
        "sft": stage_sft,
        "grid": stage_grid,
        "arm": stage_arm,
        "test": stage_test,
    }
    stages[args.stage](args, out)


if __name__ == "__main__":
    main()
