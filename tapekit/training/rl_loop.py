"""The on-policy RL loop: curriculum -> rollouts -> samples -> GRPO step, sync or asynchronous.

Per step: the task sampler (uniform, fixed order, or SEC) picks ``tasks_per_step`` tasks,
:func:`~tapekit.training.rollouts.collect_rollouts` runs ``group_size`` sampled attempts of each
through the batch runner on a :class:`~tapekit.llm.batched.BatchedTransformersLLM`
(one batched ``generate`` per round of all the tapes), every tape is scored and stored, the
token-exact samples go to :func:`~tapekit.training.rl.make_rl_batch` and one
:func:`~tapekit.training.rl.grpo_step` (groups with zero advantage are left out of the forward
pass: they give no gradient). The sampler is fed each category's mean |advantage|.

- ``mode="sync"``: rollouts on the live model, then training; the policy lag is 0.
- ``mode="async"``: a producer thread makes the rollouts of the next steps on a copy of the
  model (the trainer publishes its weights after every step; the producer loads the newest
  before each step's rollouts), while the trainer trains on older ones. The producer never runs
  more than ``max_staleness`` versions ahead, and the trainer refuses a batch older than that.

Every step appends one JSON record to ``output_dir/rl_log.jsonl`` and (sync mode) writes an
atomic checkpoint; ``resume=True`` continues from the newest one, with the same results as an
unbroken run with the same seeds (sync mode: the rollouts are seeded per step and batched in
lockstep, so they do not depend on timing).
"""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tapekit.evaluate import Task
from tapekit.store.base import TapeStore
from tapekit.training._rl_dist import RLDist, mean_std
from tapekit.training.advantages import mean_abs_by_key
from tapekit.training.callbacks import ReportTo, StepCallback, StepRecord, notify
from tapekit.training.config import LoraSettings
from tapekit.training.policies import make_policy
from tapekit.training.rl import (
    RLConfig,
    RLStepStats,
    group_minibatches,
    grpo_step,
    make_rl_batch,
    merge_stats,
)
from tapekit.training.rollouts import RolloutBatch, collect_rollouts, live_groups, merge_batches, rollout_rows

__all__ = ["RLRunConfig", "RLRunResult", "RLSetup", "make_sampler", "train_rl"]

LOG = "rl_log.jsonl"


class RLRunConfig(BaseModel):
    """Settings of an RL run (``tapekit train rl CONFIG`` reads them from YAML/JSON).

    ``setup`` (CLI) names a ``module:attr`` callable returning an :class:`RLSetup`, called with
    ``setup_args`` as keyword arguments (which tasks, which seeds: the run's data, in its
    config); ``model`` a local model directory. ``tasks_per_step`` x ``group_size`` rollouts
    per step, sampled at ``temperature`` with at most ``max_tokens`` per call. ``curriculum``: ``"sec"``,
    ``"uniform"`` or ``"fixed"`` (``fixed_order``, ``steps_per_category``). The GRPO fields are
    those of :class:`~tapekit.training.rl.RLConfig`. Each step's rollouts are used for
    ``ppo_epochs`` passes of ``minibatches`` optimiser steps each (minibatches of whole groups;
    after the first step the ratio to the sampling log-probs leaves 1 and the clipping acts).
    ``lora`` None trains every weight. ``rollout_servers`` etc.: rollouts on vLLM servers that load
    each version's LoRA adapter (:func:`~tapekit.training.policies.make_policy`).
    ``rollout_engine="llamacpp"``: rollouts in this process through llama.cpp on the base GGUF
    ``rollout_gguf`` (None: the embedded SmolLM2) with each version's LoRA adapter converted to
    GGUF (:class:`~tapekit.training.policies.LlamaCppPolicy`; ``rollout_threads`` decode).
    ``resample_rounds`` > 0: dynamic sampling (as in DAPO); after a step's rollouts, up to that
    many more rounds each draw as many new tasks as the step lacks groups with a signal (rewards
    that differ) and roll them out, so the step trains on up to ``tasks_per_step`` such groups;
    the extra rollouts cost time, which a ``StopAfter`` budget counts. 0 (the default) keeps the
    step's draws; zero-advantage groups give no gradient either way. One process only.
    ``report_to``: trackers that get each step's numbers (``"tensorboard"``, ``"trackio"``,
    ``"wandb"``, ``"mlflow"``: :class:`~tapekit.training.callbacks.ReportTo`), as for SFT/DPO.
    """

    model_config = ConfigDict(extra="forbid")

    setup: str | None = None
    setup_args: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    output_dir: str = "tapekit-rl"
    run_name: str = "rl"
    steps: int = Field(20, gt=0)
    tasks_per_step: int = Field(8, gt=0)
    group_size: int = Field(8, gt=1)
    temperature: float = Field(1.0, gt=0)
    max_tokens: int = Field(64, gt=0)
    max_loops: int | None = 8
    learning_rate: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    clip_low: float = 0.2
    clip_high: float | None = None
    kl_coef: float = Field(0.0, ge=0)
    scale_rewards: bool = True
    aggregation: Literal["token", "sequence", "constant"] = "token"
    max_grad_norm: float = 1.0
    micro_batch_size: int | None = None
    negative_scale: float = Field(1.0, ge=0, le=1)
    share_prefix: bool = True
    ppo_epochs: int = Field(1, gt=0)
    minibatches: int = Field(1, gt=0)
    curriculum: Literal["sec", "uniform", "fixed"] = "sec"
    resample_rounds: int = Field(0, ge=0)
    sec_alpha: float = Field(0.5, gt=0, le=1)
    sec_temperature: float = Field(0.2, gt=0)
    fixed_order: list[str] | None = None
    steps_per_category: int = Field(5, gt=0)
    mode: Literal["sync", "async"] = "sync"
    max_staleness: int = Field(1, ge=0)
    lora: LoraSettings | None = None
    seed: int = 0
    resume: bool = False
    checkpoint: bool = True
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    rollout_servers: list[str] = Field(default_factory=list)
    served_model: str | None = None
    adapter_dir: str | None = None
    lora_name_prefix: str | None = None
    rollout_logprobs: Literal["raw", "processed"] = "raw"
    rollout_engine: Literal["transformers", "llamacpp"] = "transformers"
    rollout_gguf: str | None = None
    rollout_threads: int | None = None
    report_to: list[str] = Field(default_factory=list)

    def grpo(self, pad_id: int) -> RLConfig:
        """The :class:`RLConfig` of one step."""
        return RLConfig(
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            kl_coef=self.kl_coef,
            aggregation=self.aggregation,
            max_tokens=self.max_tokens if self.aggregation == "constant" else None,
            scale_rewards=self.scale_rewards,
            temperature=self.temperature,
            micro_batch_size=self.micro_batch_size,
            max_grad_norm=self.max_grad_norm,
            pad_id=pad_id,
            negative_scale=self.negative_scale,
            share_prefix=self.share_prefix,
        )


@dataclass
class RLSetup:
    """The task side of an RL run: ``agent_for(llm)`` builds the agent on the policy LLM,
    ``environment`` runs its actions, ``tasks`` carry a ``category``, ``scorers`` score a tape
    (all reported), ``reward`` names the one that is the reward."""

    agent_for: Callable[[Any], Any]
    environment: Any
    tasks: Sequence[Task]
    scorers: Mapping[str, Callable[..., Any]]
    reward: str

    def __post_init__(self) -> None:
        if self.reward not in self.scorers:
            raise ValueError(
                f"RLSetup: reward {self.reward!r} is not one of the scorers {sorted(self.scorers)}"
            )


@dataclass
class RLRunResult:
    """What :func:`train_rl` did: one record per step, the rollouts refused as too stale, the
    final policy version, the wall time, and why a callback stopped the run before
    ``config.steps`` (``None`` when none did)."""

    history: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0
    policy_version: int = 0
    seconds: float = 0.0
    stopped: str | None = None

    @property
    def steps_per_hour(self) -> float:
        """Training steps per hour of wall time."""
        return 3600.0 * len(self.history) / self.seconds if self.seconds else 0.0


def make_sampler(
    config: RLRunConfig, tasks: Sequence[Task], log_fn: Callable[..., None] | None = None
) -> Any:
    """The task sampler that ``config.curriculum`` names, seeded by ``config.seed``."""
    from tapekit.training.curriculum import FixedOrderSampler, SECSampler, UniformSampler

    common: dict[str, Any] = {"seed": config.seed, "log_fn": log_fn}
    if config.curriculum == "sec":
        return SECSampler(tasks, alpha=config.sec_alpha, temperature=config.sec_temperature, **common)
    if config.curriculum == "fixed":
        order = config.fixed_order or sorted({t.category for t in tasks})
        return FixedOrderSampler(tasks, order, steps_per_category=config.steps_per_category, **common)
    return UniformSampler(tasks, **common)


def _record(
    step: int,
    version: int,
    rollouts: RolloutBatch,
    stats: RLStepStats | None,
    full: Any,
    sampler: Any,
    seconds: float,
    scorer_names: Sequence[str],
) -> dict[str, Any]:
    rewards = rollouts.rewards  # of the kept tapes: the environment's failures say nothing of the policy
    mean, std = mean_std(rewards)  # None when the environment failed every rollout
    record: dict[str, Any] = {
        "step": step,
        "policy_version": version,
        "rollout_version": rollouts.policy_version,
        "policy_lag": version - rollouts.policy_version,
        "reward_mean": mean,
        "reward_std": std,
        **{f"score_{n}": mean_std(rollouts.scores(n))[0] for n in scorer_names},
        "scored_rollouts": len(rewards),
        "zero_adv_share": full.groups.zero_share if full is not None else 1.0,
        # the groups GRPO trains on: a task whose every rollout the environment failed has none
        "groups": len(rollouts.kept_task_ids),
        "rollout_seconds": rollouts.seconds,
        "rollout_tokens_per_s": rollouts.tokens_per_s,
        "rollouts": len(rollouts.tapes),
        "rollout_prompt_tokens": rollouts.prompt_tokens,
        "rollout_output_tokens": rollouts.output_tokens,
        "failed_rollouts": rollouts.failed,
        "environment_failures": rollouts.environment_failures,
        "step_seconds": seconds,
        "sampler_values": sampler.values(),
        "sampler_probs": sampler.probabilities(),
        "categories": _task_counts(rollouts.tasks),
    }
    if stats is not None:
        keep = (
            "loss",
            "clip_fraction",
            "ratio_mean",
            "kl",
            "tokens",
            "tokens_per_s",
            "grad_norm",
            "input_tokens",
        )
        record.update(
            {
                f"train_{k}" if k in ("tokens", "tokens_per_s", "input_tokens") else k: getattr(stats, k)
                for k in keep
            }
        )
    else:
        record.update(
            loss=0.0,
            clip_fraction=0.0,
            ratio_mean=1.0,
            kl=0.0,
            train_tokens=0,
            train_tokens_per_s=0.0,
            train_input_tokens=0,
        )
    return record


def _task_counts(tasks: Sequence[Task]) -> dict[str, int]:
    """How many distinct tasks of each category a step drew."""
    unique = {t.id: t.category for t in tasks}
    return {c: sum(1 for v in unique.values() if v == c) for c in sorted(set(unique.values()))}


def _train_on(
    model: Any,
    optimizer: Any,
    rows: list[dict[str, Any]],
    rl: RLConfig,
    version: int,
    ref_model: Any,
    epochs: int = 1,
    minibatches: int = 1,
) -> tuple[RLStepStats | None, Any, dict[str, float]]:
    """``epochs`` x ``minibatches`` GRPO steps on the rows of the groups that have a signal;
    the full batch's groups (for the stats and the sampler's arm rewards) either way."""
    if not rows:
        return None, None, {}
    full = make_rl_batch(rows, rl)
    arm_rewards = (
        mean_abs_by_key(full.groups.group_mean_abs, full.group_category) if full.group_category else {}
    )
    zero = set(full.groups.zero_groups)
    live = [r for r in rows if r[rl.group_key] not in zero]
    if not live:
        return None, full, arm_rewards
    parts = [make_rl_batch(part, rl) for part in group_minibatches(live, rl.group_key, minibatches)]
    stats = [
        grpo_step(model, optimizer, part, rl, ref_model=ref_model, policy_version=version)
        for _ in range(epochs)
        for part in parts
    ]
    return merge_stats(stats), full, arm_rewards


class _Run:
    """The state of one run (model, optimiser, sampler, store, log) shared by both modes."""

    def __init__(
        self,
        setup: RLSetup,
        model: Any,
        tokenizer: Any,
        config: RLRunConfig,
        store: TapeStore,
        on_step: Callable[[dict[str, Any]], None] | None,
        dist: RLDist | None = None,
        callbacks: Sequence[StepCallback] = (),
    ) -> None:
        import torch

        self.setup, self.model, self.tokenizer, self.config, self.store = (
            setup,
            model,
            tokenizer,
            config,
            store,
        )
        self.on_step, self.dist = on_step, dist or RLDist()
        self.callbacks = list(callbacks)
        self.began = time.perf_counter()
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.sampler = make_sampler(config, setup.tasks)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.rl = config.grpo(int(pad or 0))
        self.ref_model = copy.deepcopy(model).eval() if config.kl_coef > 0 else None
        self.result = RLRunResult()
        self.step = 0
        self.attempt = 0
        self.lock = threading.Lock()

    def resume(self) -> None:
        from tapekit.training._rl_checkpoint import load_latest, restore_rng

        ckpt = load_latest(self.out)
        if ckpt is None:
            return
        self.model.load_state_dict(ckpt.state["model"])
        self.optimizer.load_state_dict(ckpt.state["optimizer"])
        restore_rng(ckpt.state)
        self.sampler.load_state_dict(ckpt.sampler)
        self.step = int(ckpt.meta["step"])
        self.result.history = list(ckpt.meta["history"])
        self.result.refused = int(ckpt.meta.get("refused", 0))
        self.attempt = int(ckpt.meta.get("attempt", 0)) + 1
        if self.dist.is_main:
            self._rewrite_log()

    def _rewrite_log(self) -> None:
        path = self.out / LOG
        tmp = path.with_name(LOG + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.result.history))
        tmp.replace(path)

    def rollouts(self, policy: Any, step: int) -> RolloutBatch:
        """The step's rollouts, with ``resample_rounds`` more rounds for groups without a signal."""
        with self.lock:
            tasks = self.dist.share(self.sampler.sample(self.config.tasks_per_step))
        version = policy.activate()  # the newest published version samples (and is recorded)
        batch = self._collect(policy, step, version, tasks, 0)
        for extra in range(1, self.config.resample_rounds + 1):
            missing = self.config.tasks_per_step - live_groups(batch)
            if missing <= 0:
                break
            with self.lock:
                more = self.sampler.sample(missing)
            first = len(batch.tapes) // self.config.group_size  # the step's tasks so far
            batch = merge_batches(batch, self._collect(policy, step, version, more, extra, first))
        batch.rows = rollout_rows(batch, self.store, self.tokenizer, exact=True)
        return batch

    def _collect(
        self, policy: Any, step: int, version: int, tasks: list[Task], round_: int, first_index: int = 0
    ) -> RolloutBatch:
        """One round of the step's rollouts: ``tasks`` at step positions from ``first_index`` on."""
        return collect_rollouts(
            self.setup.agent_for(policy.llm),
            self.setup.environment,
            tasks,
            self.setup.scorers,
            reward=self.setup.reward,
            group_size=self.config.group_size,
            step=step,
            policy_version=version,
            store=self.store,
            run=self.dist.run_name(self.config.run_name),
            attempt=self.attempt,
            max_loops=self.config.max_loops,
            batcher=policy.batcher,
            seed=self.dist.seed(self.config.seed * 1_000_003 + step * 7919 + round_ * 104_729),
            first_index=first_index,
        )

    def train(self, batch: RolloutBatch, started: float) -> None:
        version = self.step  # one policy version per RL step: the version is the step count
        train_on = self.dist.train_on if self.dist.world > 1 else _train_on
        stats, full, arm_rewards = train_on(
            self.model,
            self.optimizer,
            batch.rows,
            self.rl,
            version,
            self.ref_model,
            self.config.ppo_epochs,
            self.config.minibatches,
        )
        with self.lock:
            self.sampler.update(arm_rewards)
            record = _record(
                self.step,
                version,
                batch,
                stats,
                full,
                self.sampler,
                time.perf_counter() - started,
                list(self.setup.scorers),
            )
        record = self.dist.merge_record(record, batch, full)
        self.step += 1
        self.result.history.append(record)
        if self.dist.is_main:  # several processes: one log, rank 0's
            with (self.out / LOG).open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.on_step is not None:
            self.on_step(record)
        self._notify(record)

    def _notify(self, record: dict[str, Any]) -> None:
        """The step's :class:`StepRecord` to the callbacks; rank 0's answer stops every rank."""
        if not self.callbacks:
            return
        typed = StepRecord(
            trainer="rl",
            step=self.step,
            seconds=time.perf_counter() - self.began,
            step_seconds=float(record["step_seconds"]),
            loss=float(record["loss"]),
            reward=record["reward_mean"],
            tokens=int(record["train_tokens"]),
            metrics=record,
        )
        reason = notify(self.callbacks, typed)
        self.result.stopped = self.dist.gather(reason)[0] if self.dist.world > 1 else reason

    @property
    def done(self) -> bool:
        """Whether the run has done ``config.steps`` steps or a callback stopped it."""
        return self.step >= self.config.steps or self.result.stopped is not None

    def checkpoint(self) -> None:
        from tapekit.training._rl_checkpoint import save_checkpoint

        if not self.config.checkpoint or not self.dist.is_main:
            return
        meta = {"history": self.result.history, "refused": self.result.refused, "attempt": self.attempt}
        save_checkpoint(self.out, self.step, self.model, self.optimizer, self.sampler, meta)

    def run_sync(self) -> None:
        policy = self.dist.policy(make_policy(self.model, self.tokenizer, self.config))
        policy.publish(self.model, self.step)
        while not self.done:
            started = time.perf_counter()
            self.model.eval()
            batch = self.rollouts(policy, self.step)
            self.train(batch, started)
            policy.publish(self.model, self.step)
            self.checkpoint()
        policy.close()

    def run_async(self) -> None:
        """Producer thread (rollouts on a copy of the policy) and trainer (this thread)."""
        k = self.config.max_staleness
        policy = make_policy(self.model, self.tokenizer, self.config, copy_model=True)
        policy.publish(self.model, self.step)
        published: dict[str, Any] = {"version": self.step}
        changed = threading.Condition()
        batches: queue.Queue[RolloutBatch | BaseException] = queue.Queue()
        stop = threading.Event()

        def produce() -> None:
            step = self.step
            try:
                while not stop.is_set() and step < self.config.steps:
                    with changed:  # never more than k versions ahead of the trainer
                        oldest = step - k
                        changed.wait_for(lambda: stop.is_set() or published["version"] >= oldest)  # noqa: B023
                    if stop.is_set():
                        return
                    batches.put(self.rollouts(policy, step))
                    step += 1
            except BaseException as e:
                batches.put(e)

        producer = threading.Thread(target=produce, name="tapekit-rl-rollouts", daemon=True)
        producer.start()
        try:
            while not self.done:
                started = time.perf_counter()
                item = batches.get()
                if isinstance(item, BaseException):
                    raise item
                if self.step - item.policy_version > k:
                    self.result.refused += 1
                    continue
                self.train(item, started)
                policy.publish(self.model, self.step)
                with changed:
                    published["version"] = self.step
                    changed.notify_all()
                self.checkpoint()
        finally:
            stop.set()
            with changed:
                changed.notify_all()
            producer.join(timeout=60)
            policy.close()


def _with_lora(model: Any, lora: LoraSettings) -> Any:
    from peft import LoraConfig, get_peft_model

    target: Any = lora.target_modules
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def train_rl(
    setup: RLSetup,
    model: Any,
    tokenizer: Any,
    config: RLRunConfig,
    *,
    store: TapeStore | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    callbacks: Sequence[StepCallback] | None = None,
) -> RLRunResult:
    """Run ``config.steps`` RL steps on ``model`` (trained in place; wrapped in a LoRA adapter
    first when ``config.lora`` is set) and return the per-step records.

    ``store`` receives the rollout tapes and their LLM calls (default: an SQLite store
    ``output_dir/rollouts.db``). ``on_step`` sees each step's record (a dict) as it is logged;
    ``callbacks`` (:class:`~tapekit.training.callbacks.StepCallback`) see it as a typed
    :class:`~tapekit.training.callbacks.StepRecord` and can stop the run after any step
    (``StopAfter(seconds=...)``, ``EarlyStopping(...)``; the reason is ``result.stopped``). Under
    ``accelerate launch``/``torchrun`` the processes train data-parallel (see ``_rl_dist``).
    """
    from tapekit.store import open_store

    dist = RLDist.from_env(config.device)
    try:
        dist.check(config)
        hooks = list(callbacks or ())
        if config.report_to and dist.is_main:  # a missing tracker package fails here, before any work
            hooks.append(ReportTo(config.report_to, config.output_dir, config.run_name))
        if config.lora is not None:
            model = _with_lora(model, config.lora)
        model = model.to(dist.device(config.device))
        dist.sync_start(model)
        owned = store is None
        if store is None:
            Path(config.output_dir).mkdir(parents=True, exist_ok=True)
            store = open_store(str(Path(config.output_dir) / dist.store_name()))
        run = _Run(setup, model, tokenizer, config, store, on_step, dist, hooks)
        if config.resume:
            run.resume()
        started = run.began = time.perf_counter()
        for callback in run.callbacks:
            callback.on_begin("rl")
        try:
            if config.mode == "async":
                run.run_async()
            else:
                run.run_sync()
        finally:
            for callback in run.callbacks:
                callback.on_end()
            if owned:
                store.close()
        run.dist.finish(run.model, run.sampler, run.out)
        run.result.seconds = time.perf_counter() - started
        run.result.policy_version = run.step
        return run.result
    finally:
        dist.close()  # a gloo group left up can abort the process as it exits
