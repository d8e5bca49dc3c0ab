"""SFT, RL and SFT→RL for the web agent at one compute budget: SmolLM2-135M in headless Chromium.

    python examples/web_agent/study.py --arm sft --seed 0 --budget-seconds 1800 --out runs/sft-seed0
    python examples/web_agent/study.py --arm sft_rl --seed 0 --budget-seconds 1800 --out runs/sft_rl-seed0 \
        --branch-from runs/sft-seed0 --no-start-eval
    python examples/web_agent/study.py --quick        # the mechanics in a few minutes (CI)

``--threads`` sets torch's threads (1 is faster while other jobs share the 2 cores).

Three arms, each given the same budget of wall seconds on this machine (``--budget-seconds``,
teacher browser time included where the arm uses teacher tapes; evaluations are outside it):

- ``sft``: the programmatic teacher's tapes on training seeds, then supervised fine-tuning for
  the rest of the budget (several epochs);
- ``sft_rl``: the same SFT for a third of the budget (``Settings.sft_fraction``), then on-policy GRPO in the
  browser (``train_rl`` with a web :class:`~tapekit.training.RLSetup`) for the rest;
  ``--branch-from`` takes that SFT from the ``sft`` run of the same seed (its weights, ledger
  and evaluation at that point) instead of repeating it;
- ``rl``: GRPO from the base model, tasks drawn by the self-evolving curriculum (``--curriculum
  uniform`` is its control).

The student is the embedded SmolLM2-135M-Instruct, fully fine-tuned (135 M weights and their
AdamW state fit in memory many times over; no adapter to merge between the SFT and RL stages).
Rollouts and evaluations run the same weights through ``BatchedTransformersLLM``, the answer
held to the page's schema (the bids on the page) as llama.cpp's grammar does for the zero-shot
agent. Each arm is evaluated greedily at ``--checkpoints`` points of its budget on the
validation seeds; ``--test`` also evaluates those checkpoints on the test seeds (use it once,
for the final runs: no choice may read them); ``--pool-eval`` evaluates them on the RL pool's
training seeds too (what GRPO trains on: a check of learning, not a held-out figure). Every
step's wall seconds and FLOPs go to ``OUT/ledger.jsonl``, the evaluations to
``OUT/results.json``; the tapes (teacher, rollouts, evaluations) to ``OUT/tapes.db`` (open them
with ``tapekit studio``).

FLOPs are counted as the paper does: 6·N per trained token, 2·N per prefilled or generated
token of a rollout (failed episodes included), N the student's parameters.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tapekit import evaluate, open_store
from tapekit.evaluate import EvalReport, Task
from tapekit.llm import BatchedTransformersLLM, TransformersLLM
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
    WebEnvironment,
    eval_tasks,
    raw_reward_mean,
    reward_scorer,
    start_tape,
    teacher_agent,
    web_agent,
    without_thoughts,
)

ARMS = ("sft", "sft_rl", "rl")
QUICK_TASK = "click-dialog"  # the same element solves every seed: see --quick
QUICK_RL_LR = 2e-5


@dataclass
class Settings:
    """What a run does (the command line fills it in; ``--quick`` sets small values)."""

    arm: str = "sft_rl"
    seed: int = 0
    budget_seconds: float = 1800.0
    tasks: list[str] = field(default_factory=lambda: list(SPLIT.train_tasks))
    teacher_seeds: int = 8  # teacher episodes per task (the SFT data)
    rl_seeds: int = 50  # training seeds per task in the RL pool
    val_seeds: int = 5
    test_seeds: int = 12
    test: bool = False
    pool_eval: bool = False  # also evaluate each checkpoint on the RL pool (what GRPO trains on)
    pool_samples: int = 0  # > 0: also that many sampled episodes per pool seed at each checkpoint
    checkpoints: int = 3
    sft_fraction: float = 1 / 3
    sft_steps: int = 0  # > 0: the SFT stage to the branch point is this many optimiser steps, not seconds
    rl_steps: int = 0  # > 0: the GRPO stage is this many steps, not the rest of the budget
    sft_lr: float = 5e-5
    sft_batch: int = 8
    rl_lr: float = 1e-5
    kl_coef: float = 0.0  # > 0: a KL penalty to the policy GRPO started from (the SFT student)
    temperature: float = 1.0
    tasks_per_step: int = 4
    group_size: int = 4
    curriculum: str = "sec"
    resample_rounds: int = 0  # > 0: dynamic sampling, groups without signal replaced by new draws
    scale_rewards: bool = False
    max_tokens: int = 64  # the answer's cap; the page schema keeps every answer within it
    threads: int = 2
    start_eval: bool = True  # evaluate the untrained student first (the same for every arm and seed)
    branch_from: str | None = None  # sft_rl: the sft arm's run whose first checkpoint to continue
    out: str = "web-study"


class Ledger:
    """The arm's spending: wall seconds of counted work, FLOPs, tokens, episodes (one JSON line
    per stage to ``ledger.jsonl``)."""

    def __init__(self, path: Path, n_params: int) -> None:
        self.path, self.n = path, n_params
        self.seconds = 0.0
        self.flops = 0.0
        self.trained_tokens = 0
        self.rollout_tokens = 0
        self.episodes = 0

    def add(
        self, stage: str, seconds: float, *, trained: int = 0, rolled: int = 0, episodes: int = 0
    ) -> None:
        self.seconds += seconds
        self.flops += 6.0 * self.n * trained + 2.0 * self.n * rolled
        self.trained_tokens += trained
        self.rollout_tokens += rolled
        self.episodes += episodes
        with self.path.open("a") as f:
            f.write(json.dumps({"stage": stage, "step_seconds": seconds, **self.totals()}) + "\n")

    def resume(self, lines: list[str]) -> None:
        """Start from another run's ledger (its JSON lines): copied here, totals taken over."""
        if not lines:
            return
        last = json.loads(lines[-1])
        self.seconds, self.flops = float(last["seconds"]), float(last["flops"])
        self.trained_tokens, self.rollout_tokens = int(last["trained_tokens"]), int(last["rollout_tokens"])
        self.episodes = int(last["episodes"])
        with self.path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))

    def totals(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2),
            "flops": self.flops,
            "trained_tokens": self.trained_tokens,
            "rollout_tokens": self.rollout_tokens,
            "episodes": self.episodes,
        }


def student_agent(llm: Any) -> Any:
    """The web agent the student is (the prompt the SFT data is rendered with, too): the answer
    is the action alone, held to the page's bids. No rationale: it triples the sampled tokens,
    and on 2 cores every token counts against the budget (zero-shot, the rationale scored 0.19
    against 0.13 on validation, docs/experiments/web-agent.md; all arms share this choice)."""
    return web_agent(llm, name="student", constrain="page", rationale=False)


def load_student() -> tuple[Any, Any]:
    """The embedded SmolLM2-135M-Instruct as a trainable fp32 model and its tokenizer."""
    return TransformersLLM(device="cpu", dtype="float32").load()


def teacher_tapes(settings: Settings, env: WebEnvironment, store: Any, ledger: Ledger) -> list[Any]:
    """The teacher's solved episodes on training seeds (their browser time is counted)."""
    first = 1000 * settings.seed  # each training seed of the study its own teacher episodes
    tasks = [
        Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
        for t in settings.tasks
        for s in SPLIT.train_seeds[first : first + settings.teacher_seeds]
    ]
    started = time.perf_counter()
    report = evaluate(
        teacher_agent(), env, tasks, reward_scorer, name=f"teacher-seed{settings.seed}", store=store
    )
    ledger.add("teacher", time.perf_counter() - started, episodes=len(tasks))
    solved = {s.tape_id for s in report.samples if sample_reward(s) > 0}
    # the student writes no rationale: the teacher's thoughts are not part of what it learns
    return [without_thoughts(tape) for tape_id, tape in report.tapes.items() if tape_id in solved]


class StudyProgress:
    """A live status line for a long run, on a terminal only: the stage, the step, the last
    loss (SFT) or mean reward (GRPO), and the budget spent and left. Silent when the output is
    not a terminal (a log file, CI): the run's own lines (checkpoints, GRPO steps) say enough
    there. ``with progress:`` (or ``start``/``stop``) brackets the run; ``update`` changes what
    the line says."""

    def __init__(self, budget_seconds: float, console: Any = None) -> None:
        from rich.console import Console

        self.budget = budget_seconds
        self.console = console if console is not None else Console()
        self.enabled = bool(self.console.is_terminal)
        self._live: Any = None
        self._started = time.perf_counter()

    def start(self) -> None:
        """Show the line (on a terminal)."""
        if self.enabled and self._live is None:
            from rich.live import Live

            self._live = Live("", console=self.console, transient=True, refresh_per_second=4)
            self._live.start()

    def stop(self) -> None:
        """Take the line away."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def line(
        self,
        stage: str,
        spent: float,
        *,
        step: int | None = None,
        of: float | None = None,
        loss: float | None = None,
        reward: float | None = None,
    ) -> str:
        """What the line says: ``stage``, ``step`` (of ``of`` for a stage counted in steps), the
        loss or reward, the budget's seconds spent and left, and the wall time so far."""
        parts = [stage]
        if step is not None:
            parts.append(f"step {step}" + (f" of {of:.0f}" if of else ""))
        if loss is not None:
            parts.append(f"loss {loss:.3f}")
        if reward is not None:
            parts.append(f"reward {reward:.2f}")
        left = max(self.budget - spent, 0.0)
        parts.append(f"budget {spent:.0f} of {self.budget:.0f} s spent, {left:.0f} s left")
        parts.append(f"{time.perf_counter() - self._started:.0f} s wall")
        return " · ".join(parts)

    def __enter__(self) -> StudyProgress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def update(self, stage: str, spent: float, **figures: Any) -> None:
        """Say where the run is now (see :meth:`line`)."""
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(self.line(stage, spent, **figures)), refresh=True)


class Budget(StepCallback):
    """Charges a training run's steps to the ledger and runs the checkpoints on the way.

    After each step (an SFT optimiser step, a GRPO step) the wall time since the last one goes
    to the ledger (the run's setup is charged to its first step; the evaluations run here are
    not charged), with its tokens: for SFT the growth of the input tokens seen, for RL the
    step's trained and rollout tokens and episodes. When the ledger passes the next of ``ends``
    (budget seconds), ``at_point(i)`` runs; after the last one the run stops. With
    ``unit="steps"`` the end points count the stage's own steps instead of the ledger's seconds
    (the spending is charged all the same): a stage of a fixed number of steps trains the same
    model on any machine, where a share of seconds gives a faster machine more steps. One run per arm
    and stage keeps the optimiser's moments, the data order and the curriculum going across
    checkpoints (a run per checkpoint restarted all three).
    """

    def __init__(
        self,
        ledger: Ledger,
        stage: str,
        ends: list[float],
        at_point: Callable[[int], object],
        clock: Callable[[], float] = time.perf_counter,
        unit: str = "seconds",
        progress: StudyProgress | None = None,
    ) -> None:
        if not ends or sorted(ends) != list(ends):
            raise ValueError(f"Budget needs end points in increasing order, got {ends}")
        if unit not in ("seconds", "steps"):
            raise ValueError(f"Budget counts 'seconds' or 'steps', got {unit!r}")
        self.ledger, self.stage, self.ends, self.at_point, self.clock = ledger, stage, ends, at_point, clock
        self.unit = unit
        self.progress = progress
        self.done = 0  # end points passed
        self.steps = 0  # the stage's steps so far
        self.tokens_seen = 0
        self.loss: float | None = None  # the last loss the trainer logged (SFT)
        self.start()
        self._reason = ""

    def start(self) -> None:
        """The stage begins now (call just before the trainer: its setup counts; the
        constructor calls it too)."""
        self.started = self.clock()
        self.charged = self.evaluating = 0.0

    def on_step(self, record: StepRecord) -> bool | None:
        """Charge the step; evaluate at each end point passed; ``True`` after the last."""
        spent = self.clock() - self.started - self.evaluating
        seconds, self.charged = spent - self.charged, spent
        self.steps += 1
        if record.trainer == "rl":
            m = record.metrics
            self.ledger.add(
                f"{self.stage}-step{record.step}",
                seconds,
                trained=int(m["train_input_tokens"]),  # every token through forward and backward
                rolled=int(m["rollout_prompt_tokens"]) + int(m["rollout_output_tokens"]),
                episodes=int(m["rollouts"]),
            )
            mean = m.get("reward_mean")  # None: the environment failed every rollout of the step
            print(
                f"  rl step {record.step}: reward {'none' if mean is None else f'{mean:.2f}'} "
                f"({seconds:.0f} s, budget used {self.ledger.seconds:.0f} s)",
                flush=True,
            )
        else:
            seen = int(record.tokens or self.tokens_seen)
            self.ledger.add(f"{self.stage}-step{record.step}", seconds, trained=seen - self.tokens_seen)
            self.tokens_seen = seen
            if record.loss is not None:
                self.loss = record.loss
        if self.progress is not None:
            of = self.ends[-1] if self.unit == "steps" else None
            figures: dict[str, Any] = {"step": record.step, "of": of}
            if record.trainer == "rl":
                figures["reward"] = record.metrics.get("reward_mean")
            else:
                figures["loss"] = self.loss
            self.progress.update(self.stage, self.ledger.seconds, **figures)
        while self.done < len(self.ends) and self._progress() >= self.ends[self.done]:
            began = self.clock()
            self.at_point(self.done)
            self.evaluating += self.clock() - began
            self.done += 1
        if self.done == len(self.ends):
            self._reason = f"{self.stage}: budget point {self.ends[-1]:.0f} {self.unit} reached"
            return True
        return None

    def _progress(self) -> float:
        """Where the stage stands, in the budget's unit."""
        return self.ledger.seconds if self.unit == "seconds" else float(self.steps)

    @property
    def reason(self) -> str:
        """Why the run stopped."""
        return self._reason


def sft_run(settings: Settings, model: Any, tokenizer: Any, tapes: list[Any], budget: Budget) -> None:
    """Supervised fine-tuning on the teacher's tapes until ``budget`` passes its last point
    (epochs repeat the data)."""
    llm = TransformersLLM.from_model(model, tokenizer)
    budget.start()
    samples = make_samples(tapes, reuse_with=student_agent(llm), tokenizer=tokenizer)
    config = SFTConfig(
        output_dir=str(Path(settings.out) / "sft"),
        lora=None,
        learning_rate=settings.sft_lr,
        lr_scheduler="constant",
        epochs=1000.0,  # the budget ends it
        batch_size=2,  # packed rows of up to 1,024 tokens: 8 at once held ~10 GB of activations
        grad_accum=max(settings.sft_batch // 2, 1),
        max_length=1024,
        device="cpu",
        dtype="auto",  # bf16 autocast where the CPU has bf16 instructions (1.4x fp32 there), else fp32
        seed=settings.seed,
        logging_steps=1,
    )
    train_sft(samples.dataset, model, tokenizer=tokenizer, config=config, callbacks=[budget])


def sample_reward(sample: Any) -> float:
    """A sample's reward (the one scorer's value)."""
    return float(next(iter(sample.scores.values())).value)


def raw_of(report: EvalReport, samples: Iterable[Any]) -> float | None:
    """The mean of MiniWob's raw reward over ``samples``' episodes (in [-1, 1]): reported
    beside success, the binary reward, which counts partial credit as a pass."""
    return raw_reward_mean(report.tapes[s.tape_id] for s in samples if s.tape_id in report.tapes)


def rl_tasks(settings: Settings) -> list[Task]:
    """The RL pool: training seeds of each task, after the teacher's (never validation or test)."""
    first = 1000 * settings.seed + 500
    return [
        Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
        for t in settings.tasks
        for s in SPLIT.train_seeds[first : first + settings.rl_seeds]
    ]


def rl_setup(
    tasks: list[str] | None = None,
    seed: int = 0,
    rl_seeds: int = 8,
    *,
    environment: WebEnvironment | None = None,
    timeout_s: float = 30.0,
    max_concurrent: int = 32,
    screenshots: bool = False,
) -> RLSetup:
    """GRPO for the student in the browser: the RL pool of study seed ``seed`` (``rl_seeds``
    training seeds of each of ``tasks``; default all training tasks), the binary MiniWob++
    reward. ``tapekit train rl`` builds it from a config (``setup:
    examples.web_agent.study:rl_setup`` with ``setup_args``; a new headless Chromium is
    launched, and closed with the run); the study passes its own ``environment``."""
    settings = Settings(seed=seed, rl_seeds=rl_seeds, tasks=list(tasks or SPLIT.train_tasks))
    settings.tasks = [t.removeprefix("miniwob.") for t in settings.tasks]
    env = environment or WebEnvironment(
        max_concurrent=max_concurrent, timeout_s=timeout_s, screenshots=screenshots
    )
    return RLSetup(
        agent_for=student_agent,
        environment=env,
        tasks=rl_tasks(settings),
        scorers={"reward": reward_scorer},
        reward="reward",
    )


def rl_run(
    settings: Settings, model: Any, tokenizer: Any, env: WebEnvironment, store: Any, budget: Budget
) -> None:
    """GRPO in the browser until ``budget`` passes its last point (train_rl with a web setup;
    the model is trained in place)."""
    budget.start()
    setup = rl_setup(settings.tasks, settings.seed, settings.rl_seeds, environment=env)
    config = RLRunConfig(
        output_dir=str(Path(settings.out) / "rl"),
        run_name="rl",
        steps=100_000,  # the budget ends it
        learning_rate=settings.rl_lr,
        grpo=GRPOConfig(
            kl_coef=settings.kl_coef,
            scale_rewards=settings.scale_rewards,
            micro_batch_size=4,  # samples per forward/backward: the whole batch at once held ~8 GB
        ),
        rollouts=RolloutConfig(
            tasks_per_step=settings.tasks_per_step,
            group_size=settings.group_size,
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
            max_loops=None,
            resample_rounds=settings.resample_rounds,
        ),
        curriculum=CurriculumConfig(kind=settings.curriculum),
        lora=None,
        seed=settings.seed,
        checkpoint=False,
    )

    train_rl(setup, model, tokenizer, config, store=store, callbacks=[budget])


def evaluate_student(
    model: Any,
    tokenizer: Any,
    env: WebEnvironment,
    tasks: list[Task],
    name: str,
    store: Any,
    *,
    temperature: float = 0.0,
    k: int = 1,
    max_tokens: int = Settings.max_tokens,
) -> EvalReport:
    """Episodes of the current weights, greedy by default (``k`` sampled attempts per task at
    ``temperature`` otherwise), answers of at most ``max_tokens`` (the page schema keeps every
    answer within it), decoded in batches of at most 32 episodes. An episode the
    browser failed (a page that never loaded) is run once more after the others; one that
    fails again is marked (``environment_failure``), and the study leaves it out of its figures
    and counts it, as GRPO does."""
    llm = BatchedTransformersLLM.from_model(model, tokenizer, temperature=temperature, max_tokens=max_tokens)
    llm.batcher.max_wait_s = 0.5  # the episodes' next requests arrive within a browser step
    return evaluate(
        student_agent(llm),
        env,
        tasks,
        reward_scorer,
        k=k,
        name=name,
        store=store,
        max_concurrency=min(len(tasks) * k, 32),
        environment_retries=1,
    )


def sampled_success(store: Any, run: str, steps: int, last: int = 2) -> dict[str, Any]:
    """What GRPO's own rollouts say about the policy on the pool it trains on.

    Each GRPO step rolls out the current policy (sampled, at the rollout temperature); step 0's
    rollouts are the policy GRPO started from. Per pool task (a training seed): its success in
    step 0's rollouts and in the ``last`` steps' rollouts (the policy at its last versions), and
    the paired difference of the two over the tasks seen in both (bootstrap interval over
    tasks, stratified by MiniWob++ task). Episodes the environment ended by its own failure are
    left out, as GRPO leaves them out. A check of learning on training seeds, not a held-out
    figure.
    """
    from tapekit import ENVIRONMENT_FAILURE
    from tapekit.store import TapeFilter

    per_step: list[dict[str, list[float]]] = []
    for step in range(steps):
        rewards: dict[str, list[float]] = {}
        for tape_id in store.list_tapes(where=TapeFilter(tag=f"rl:{run}:step:{step}")):
            result = store.get_tape(tape_id).metadata.result
            if not result.get(ENVIRONMENT_FAILURE):  # collect_rollouts records the environment's failures
                rewards.setdefault(result["task_id"], []).append(float(result["reward"]))
        per_step.append(rewards)

    def means(parts: list[dict[str, list[float]]]) -> dict[str, float]:
        return success_by_seed((task, v) for part in parts for task, values in part.items() for v in values)

    def step_mean(rewards: dict[str, list[float]]) -> float | None:
        n = sum(len(v) for v in rewards.values())
        return sum(sum(v) for v in rewards.values()) / n if n else None  # None: no episode ran

    out: dict[str, Any] = {"per_step": [step_mean(r) for r in per_step]}
    if steps <= last:
        return out  # no step after the first ones to compare with
    first, final = means(per_step[:1]), means(per_step[-last:])
    return {
        **out,
        "first": first,
        "last": final,
        "last_steps": last,
        "difference": _paired_by_seed(final, first),
    }


def success_by_seed(episodes: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Each pool seed's success rate: the mean reward of its episodes, from ``(task id, reward)``
    pairs; the seeds in sorted order."""
    rewards: dict[str, list[float]] = {}
    for task, reward in episodes:
        rewards.setdefault(task, []).append(reward)
    return {task: sum(v) / len(v) for task, v in sorted(rewards.items())}


def pool_gain(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The sampled success on the pool's seeds from checkpoint ``before`` to ``after``: the
    paired difference over the seeds, bootstrap interval stratified by MiniWob++ task."""
    gain = _paired_by_seed(after["pool_sampled"]["per_task"], before["pool_sampled"]["per_task"])
    return {"from": before["label"], "to": after["label"], **gain}


def _paired_by_seed(after: dict[str, float], before: dict[str, float]) -> dict[str, Any]:
    """Mean of ``after − before`` over the pool seeds both score, with its bootstrap interval
    stratified by MiniWob++ task (the part of a task id before ``/``)."""
    from tapekit.evaluate import paired_difference

    seeds = sorted(set(after) & set(before))
    if not seeds:  # e.g. the environment failed every episode of a step compared
        return {"value": None, "low": None, "high": None, "tasks": 0}
    d = paired_difference(
        [after[t] for t in seeds], [before[t] for t in seeds], strata=[t.split("/")[0] for t in seeds]
    )
    return {"value": d.value, "low": d.low, "high": d.high, "tasks": len(seeds)}


BRANCH = "branch"  # in an sft run's folder: its weights and ledger after the first SFT stage
# what an sft run and the sft_rl run that branches from it must share
_BRANCH_KEYS = (
    "seed", "tasks", "budget_seconds", "sft_fraction", "sft_lr", "sft_batch", "teacher_seeds",
    "val_seeds", "test_seeds", "test", "threads",
)  # fmt: skip


def save_branch(out: Path, model: Any, ledger: Ledger, point: dict[str, Any], settings: Settings) -> None:
    """Keep the sft arm's weights, ledger and evaluation at the end of its first stage (the
    ``sft_fraction`` of the budget), the point an ``sft_rl`` run of the same seed branches from."""
    import torch

    folder = out / BRANCH
    folder.mkdir(exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")
    lines = ledger.path.read_text().splitlines()
    info = {"settings": asdict(settings), "ledger": lines, "checkpoint": point}
    (folder / "branch.json").write_text(json.dumps(info, indent=1) + "\n")


def load_branch(settings: Settings, model: Any, ledger: Ledger) -> dict[str, Any]:
    """Continue an sft run's first stage: its weights into ``model``, its spending into
    ``ledger``; returns its checkpoint. Raises ``ValueError`` when the run does not match."""
    import torch

    folder = Path(str(settings.branch_from)) / BRANCH
    if not (folder / "branch.json").is_file():
        raise ValueError(
            f"--branch-from {settings.branch_from}: no {BRANCH}/branch.json there; run "
            "`study.py --arm sft` with the same seed, tasks and budget into that folder first"
        )
    info = json.loads((folder / "branch.json").read_text())
    mine = asdict(settings)
    for key in _BRANCH_KEYS:
        if info["settings"][key] != mine[key]:
            raise ValueError(
                f"--branch-from {settings.branch_from}: its {key} is {info['settings'][key]!r}, "
                f"this run's is {mine[key]!r}"
            )
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    ledger.resume(info["ledger"])
    return {**info["checkpoint"], "shared_with": str(settings.branch_from)}


def _stage_ends(start: float, stop: float, parts: int) -> list[float]:
    """``parts`` equal shares of the budget from ``start`` to ``stop`` seconds, as end points."""
    return [start + (stop - start) * (i + 1) / parts for i in range(parts)]


def run_arm(settings: Settings) -> dict[str, Any]:
    """One arm, one seed: train to the budget, evaluating at each checkpoint.

    Checkpoints (``settings.checkpoints`` = n): ``sft`` at the ``sft_fraction`` of the budget and
    then n − 1 equal shares of the rest; ``sft_rl`` at the same first point (its branch), then
    n − 1 shares of GRPO; ``rl`` at n equal shares. SFT is one training run and GRPO is one
    (:class:`Budget` evaluates at the points between steps, uncharged), so neither the
    optimiser's state nor the data order nor the curriculum restarts at a checkpoint.
    """
    import torch

    if settings.arm not in ARMS:
        raise ValueError(f"--arm must be one of {', '.join(ARMS)}, got {settings.arm!r}")
    if settings.branch_from and settings.arm != "sft_rl":
        raise ValueError("--branch-from continues an sft run: it is for --arm sft_rl only")
    if settings.sft_steps < 0 or settings.rl_steps < 0:
        steps = (settings.sft_steps, settings.rl_steps)
        raise ValueError(f"sft_steps and rl_steps count steps (0: seconds), got {steps}")
    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.threads)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "ledger.jsonl").exists():
        raise ValueError(f"{out} already holds a run (ledger.jsonl): give each run its own --out")
    model, tokenizer = load_student()
    ledger = Ledger(out / "ledger.jsonl", sum(p.numel() for p in model.parameters()))
    store = open_store(str(out / "tapes.db"))
    val = eval_tasks("validation", settings.val_seeds, settings.tasks) if settings.val_seeds else []
    test = eval_tasks("test", settings.test_seeds, settings.tasks) if settings.test else []
    # the training seeds GRPO samples: whether RL learns what it trains on, not a held-out figure
    pool = rl_tasks(settings) if settings.pool_eval else []
    results: dict[str, Any] = {"settings": asdict(settings), "checkpoints": []}

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")

    progress = StudyProgress(settings.budget_seconds)

    def checkpoint(label: str) -> dict[str, Any]:
        progress.update(f"evaluating {label} ({len(val + test + pool)} episodes)", ledger.seconds)
        point: dict[str, Any] = {"label": label, **ledger.totals()}
        # both splits in one evaluation: 200 episodes decode in bigger batches than 40 + 160
        started = time.perf_counter()
        report = evaluate_student(
            model, tokenizer, env, val + test + pool, f"{settings.arm}-s{settings.seed}-{label}", store,
            max_tokens=settings.max_tokens,
        )  # fmt: skip
        point["eval_seconds"] = round(time.perf_counter() - started, 1)
        for split, tasks in (("validation", val), ("test", test), ("pool", pool)):
            if tasks:
                ids = {t.id for t in tasks}
                whole = report.model_copy(update={"samples": [s for s in report.samples if s.task_id in ids]})
                part = whole.without_environment_failures()
                score = part.mean_score() if part.samples else None
                point[split] = {
                    "success": score.value if score else None,
                    "low": score.low if score else None,
                    "high": score.high if score else None,
                    # beside binary success, which counts MiniWob's partial credit as a pass
                    "raw_reward": raw_of(report, part.samples),
                    "per_task": {s.task_id: sample_reward(s) for s in part.samples},
                    "environment_failures": whole.n_environment_failures,  # the browser failed: not scored
                }
        if pool and settings.pool_samples:  # the policy as GRPO samples it, on the pool's seeds
            report = evaluate_student(
                model, tokenizer, env, pool, f"{settings.arm}-s{settings.seed}-{label}-sampled", store,
                temperature=settings.temperature, k=settings.pool_samples, max_tokens=settings.max_tokens,
            )  # fmt: skip
            kept = report.without_environment_failures().samples
            rates = success_by_seed((sample.task_id, sample_reward(sample)) for sample in kept)
            point["pool_sampled"] = {
                "success": sum(rates.values()) / len(rates) if rates else None,
                "raw_reward": raw_of(report, kept),
                "per_task": rates,
                "episodes": len(kept),
                "environment_failures": report.n_environment_failures,
            }
        results["checkpoints"].append(point)
        shown = {
            k: None if v["success"] is None else round(v["success"], 3)
            for k, v in point.items()
            if isinstance(v, dict) and "success" in v
        }
        print(f"{settings.arm} seed {settings.seed} at {label} ({ledger.seconds:.0f} s): {shown}", flush=True)
        save()
        return point

    budget, n = settings.budget_seconds, settings.checkpoints
    branch_at = budget * settings.sft_fraction
    with progress, WebEnvironment(max_concurrent=32, timeout_s=30) as env:
        if settings.start_eval:
            checkpoint("start")
        if settings.branch_from:
            results["checkpoints"].append(load_branch(settings, model, ledger))
            save()
        elif settings.arm in ("sft", "sft_rl"):
            episodes = len(settings.tasks) * settings.teacher_seeds
            progress.update(f"teacher ({episodes} episodes)", ledger.seconds)
            tapes = teacher_tapes(settings, env, store, ledger)
            if settings.sft_steps:  # the budget in steps: the branch point, then the rest in proportion
                unit, ends = "steps", [float(settings.sft_steps)]
                if settings.arm == "sft" and n > 1:
                    ends += _stage_ends(settings.sft_steps, settings.sft_steps / settings.sft_fraction, n - 1)
            else:
                unit, ends = "seconds", [branch_at]
                if settings.arm == "sft" and n > 1:
                    ends += _stage_ends(branch_at, budget, n - 1)

            def sft_point(i: int) -> None:
                point = checkpoint(f"sft{i}")
                if i == 0 and settings.arm == "sft":
                    save_branch(out, model, ledger, point, settings)

            progress.update("sft: starting", ledger.seconds)
            sft_budget = Budget(ledger, "sft", ends, sft_point, unit=unit, progress=progress)
            sft_run(settings, model, tokenizer, tapes, sft_budget)
        if settings.arm in ("sft_rl", "rl"):
            parts = n if settings.arm == "rl" else max(n - 1, 1)
            if settings.rl_steps:
                unit, ends = "steps", _stage_ends(0, settings.rl_steps, parts)
            else:
                unit, ends = "seconds", _stage_ends(ledger.seconds, budget, parts)
            progress.update("rl: starting", ledger.seconds)
            rl_point: Callable[[int], object] = lambda i: checkpoint(f"rl{i}")  # noqa: E731
            rl_budget = Budget(ledger, "rl", ends, rl_point, unit=unit, progress=progress)
            rl_run(settings, model, tokenizer, env, store, rl_budget)
            results["rl_sampled"] = sampled_success(store, "rl", rl_budget.steps)
            # GRPO's start (the branch point; for rl the untrained student, when evaluated) to its end
            starts = [c for c in results["checkpoints"] if c["label"] in ("sft0", "start")]
            if settings.pool_samples and starts:
                results["pool_sampled_gain"] = pool_gain(starts[-1], results["checkpoints"][-1])
            save()
        results["environment"] = dict(env.stats)  # launches, restarts, hangs, crashes, replays
    results["peak_rss_mb"] = peak_rss_mb()
    save()
    store.close()
    return results


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", choices=ARMS, default="sft_rl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-seconds", type=float, default=1800.0)
    p.add_argument("--tasks", nargs="*", default=None, help="training tasks (default: all 14)")
    p.add_argument("--test", action="store_true", help="also evaluate on the test seeds (final runs only)")
    p.add_argument(
        "--pool-eval",
        action="store_true",
        help="also score each checkpoint on the RL pool's training seeds (what GRPO trains on)",
    )
    p.add_argument(
        "--pool-samples",
        type=int,
        default=0,
        help="with --pool-eval: also this many sampled episodes per pool seed at each checkpoint",
    )
    p.add_argument("--curriculum", choices=["sec", "uniform"], default="sec")
    p.add_argument(
        "--resample-rounds",
        type=int,
        default=0,
        help="dynamic sampling: up to this many more rounds per GRPO step replace groups whose "
        "rollouts all scored alike (no gradient) with new draws; their time counts in the budget",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="rollout sampling temperature (at the paper's 0.25 every group of 4 agreed: no signal)",
    )
    p.add_argument("--group-size", type=int, default=4, help="rollouts per task in a GRPO step")
    p.add_argument("--tasks-per-step", type=int, default=4, help="tasks (groups) in a GRPO step")
    p.add_argument("--rl-lr", type=float, default=1e-5)
    p.add_argument("--kl-coef", type=float, default=0.0, help="GRPO's KL penalty to its start")
    p.add_argument("--sft-lr", type=float, default=5e-5)
    p.add_argument("--val-seeds", type=int, default=5, help="validation seeds per task (0: none)")
    p.add_argument("--test-seeds", type=int, default=12)
    p.add_argument("--checkpoints", type=int, default=3, help="evaluations along the budget (see run_arm)")
    p.add_argument(
        "--no-start-eval",
        action="store_true",
        help="skip evaluating the untrained student (it is the same for every arm and seed)",
    )
    p.add_argument(
        "--branch-from",
        default=None,
        help="sft_rl: continue from this sft run's first checkpoint instead of repeating its SFT",
    )
    p.add_argument(
        "--sft-steps",
        type=int,
        default=0,
        help="SFT to the branch point in optimiser steps, not seconds (0: seconds)",
    )
    p.add_argument(
        "--rl-steps", type=int, default=0, help="GRPO for this many steps, not seconds (0: seconds)"
    )
    p.add_argument("--out", default=None)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--quick", action="store_true", help=f"one task ({QUICK_TASK}), a small budget (CI)")
    a = p.parse_args(argv)
    s = Settings(
        arm=a.arm,
        seed=a.seed,
        budget_seconds=a.budget_seconds,
        test=a.test,
        pool_eval=a.pool_eval,
        pool_samples=a.pool_samples,
        curriculum=a.curriculum,
        resample_rounds=a.resample_rounds,
        temperature=a.temperature,
        group_size=a.group_size,
        tasks_per_step=a.tasks_per_step,
        rl_lr=a.rl_lr,
        kl_coef=a.kl_coef,
        sft_lr=a.sft_lr,
        val_seeds=a.val_seeds,
        test_seeds=a.test_seeds,
        threads=a.threads,
        checkpoints=a.checkpoints,
        start_eval=not a.no_start_eval,
        branch_from=a.branch_from,
        sft_steps=a.sft_steps,
        rl_steps=a.rl_steps,
    )
    if s.checkpoints < 1:
        p.error(f"--checkpoints must be at least 1, got {s.checkpoints}")
    if s.pool_samples < 0 or (s.pool_samples and not s.pool_eval):
        p.error("--pool-samples counts sampled episodes per pool seed and needs --pool-eval")
    if s.sft_steps < 0 or s.rl_steps < 0:
        p.error("--sft-steps and --rl-steps count steps (0: the budget's seconds)")
    if s.resample_rounds < 0:
        p.error(f"--resample-rounds counts extra rounds per GRPO step, got {s.resample_rounds}")
    if a.tasks:
        s.tasks = [t.removeprefix("miniwob.") for t in a.tasks]
    if a.quick:  # docs/experiments/web-training.md, "The quick task: click-dialog" for how this was chosen
        s.tasks, s.teacher_seeds, s.rl_seeds, s.val_seeds, s.checkpoints = [QUICK_TASK], 4, 8, 0, 2
        s.sft_lr, s.sft_steps = 1e-5, 4  # a weak SFT: the student half-solves the task, stochastically
        s.rl_steps, s.rl_lr = 4, QUICK_RL_LR
        s.start_eval = False  # 4 SFT steps at 1e-5 leave the student close to the untrained model
        s.tasks_per_step, s.group_size = 8, 4  # every pool seed in every step, 4 attempts each
        # the 8 pool seeds GRPO trains on: greedy, and 16 samples each (8 once left the gain's
        # interval touching 0 in a run whose gain was +0.19: web-training.md, "The quick task")
        s.pool_eval, s.pool_samples = True, 16
    s.out = a.out or f"web-study/{s.arm}-seed{s.seed}"
    return s


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (``getrusage``; 0.0 where it is unavailable):
    recorded in ``results.json`` since memory exhaustion once hung every page load in CI."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0.0
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for this process, as ``MALLOC_ARENA_MAX`` does (unless that is
    set): the study's threads (the browser's loop, the batcher, torch) each grew an arena of
    their own, and ``--quick`` then held 11.5 GB where it holds about 7 GB with two arenas
    (docs/experiments/web-training.md); beside another large process that exhausted the
    machine's memory and hung every page load. Returns whether the cap was set; a no-op off
    glibc Linux."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_arena_max = -8  # glibc's mallopt parameter number for the arena cap
    return bool(libc.mallopt(m_arena_max, arenas))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    settings = parse_args(argv)
    limit_malloc_arenas()  # before any thread starts allocating
    return run_arm(settings)


if __name__ == "__main__":
    main()
