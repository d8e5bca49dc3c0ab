"""The on-policy RL trainer: curriculum -> rollouts -> samples -> GRPO step, sync or asynchronous.

Per step: the task sampler (uniform, fixed order, or SEC) picks ``rollouts.tasks_per_step``
tasks, :func:`~tapekit.training.rl.collect_rollouts` runs ``rollouts.group_size`` sampled
attempts of each through the batch runner on a :class:`~tapekit.llm.batched.BatchedTransformersLLM`
(one batched ``generate`` per round of all the tapes), every tape is scored and stored, the
token-exact samples go to :func:`~tapekit.training.rl.make_rl_batch` and
``grpo.ppo_epochs`` x ``grpo.minibatches`` :func:`~tapekit.training.rl.grpo_step` (groups
with zero advantage are left out of the forward pass: they give no gradient). The sampler is
fed each category's mean |advantage|.

- ``mode="sync"``: rollouts on the live model, then training; the policy lag is 0.
- ``mode="async"``: a producer thread makes the rollouts of the next steps on a copy of the
  model (the trainer publishes its weights after every step; the producer loads the newest
  before each step's rollouts), while the trainer trains on older ones. The producer never runs
  more than ``max_staleness`` versions ahead, and the trainer refuses a batch older than that.

Every step's :class:`~tapekit.training.rl.RLStepRecord` is appended to
``output_dir/rl_log.jsonl`` and handed to the step callbacks, and (sync mode) an atomic
checkpoint is written; ``resume=True`` continues from the newest one (the log is cut back to
the steps it holds, to none when there is none), with the same results as
an unbroken run with the same seeds (sync mode: the rollouts are seeded per step and batched in
lockstep, so they do not depend on timing).
"""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapekit.evaluate import Task
from tapekit.store.base import TapeStore
from tapekit.training._hf import lora_config
from tapekit.training.callbacks import ReportTo, StepCallback, StepRecord, notify
from tapekit.training.rl._config import RLRunConfig, make_sampler
from tapekit.training.rl._dist import RLDist
from tapekit.training.rl._policies import make_policy
from tapekit.training.rl._record import RLStepRecord, step_record
from tapekit.training.rl._rollouts import (
    RolloutBatch,
    collect_rollouts,
    live_groups,
    merge_batches,
    rollout_rows,
)

if TYPE_CHECKING:
    from tapekit.training.rl._batch import RLBatch
    from tapekit.training.rl._step import RLStepStats

LOG = "rl_log.jsonl"


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
    """What :func:`train_rl` did: one :class:`~tapekit.training.rl.RLStepRecord` per step, the
    rollouts refused as too stale, the final policy version, the wall time, and why a callback
    stopped the run before ``config.steps`` (``None`` when none did)."""

    history: list[RLStepRecord] = field(default_factory=list)
    refused: int = 0
    policy_version: int = 0
    seconds: float = 0.0
    stopped: str | None = None

    @property
    def steps_per_hour(self) -> float:
        """Training steps per hour of wall time."""
        return 3600.0 * len(self.history) / self.seconds if self.seconds else 0.0


class _DictHook(StepCallback):
    """The deprecated ``train_rl(on_step=...)``: the function gets each record's log line."""

    def __init__(self, fn: Callable[[dict[str, Any]], None]) -> None:
        self.fn = fn

    def on_step(self, record: StepRecord) -> bool | None:
        """Call the function with the log line (``record.metrics``)."""
        self.fn(record.metrics)
        return None


class _Run:
    """The state of one run (model, optimiser, sampler, store, log) shared by both modes."""

    def __init__(
        self,
        setup: RLSetup,
        model: Any,
        tokenizer: Any,
        config: RLRunConfig,
        store: TapeStore,
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
        self.dist = dist or RLDist()
        self.callbacks = list(callbacks)
        self.began = time.perf_counter()
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.sampler = make_sampler(config, setup.tasks)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.rl = config.step_config(int(pad or 0))
        self.ref_model = copy.deepcopy(model).eval() if config.grpo.kl_coef > 0 else None
        self.result = RLRunResult()
        self.step = 0
        self.attempt = 0
        self.rows: list[dict[str, Any]] = []  # the last step's training rows
        self.lock = threading.Lock()

    def resume(self) -> None:
        from tapekit.training.rl._checkpoint import load_latest, restore_rng

        ckpt = load_latest(self.out)
        if ckpt is not None:
            self.model.load_state_dict(ckpt.state["model"])
            self.optimizer.load_state_dict(ckpt.state["optimizer"])
            restore_rng(ckpt.state)
            self.sampler.load_state_dict(ckpt.sampler)
            self.step = int(ckpt.meta["step"])
            seconds = ckpt.meta.get("seconds") or [0.0] * len(ckpt.meta["history"])
            self.result.history = [
                RLStepRecord.from_log(line, seconds=s)
                for line, s in zip(ckpt.meta["history"], seconds, strict=True)
            ]
            self.result.refused = int(ckpt.meta.get("refused", 0))
            self.attempt = int(ckpt.meta.get("attempt", 0)) + 1
        if self.config.journal and self._replay():
            self.checkpoint(journal=False)  # the rebuilt state, so the replay is not done again
        if self.dist.is_main:  # the log holds the steps resumed from: none before a first checkpoint
            self._rewrite_log()

    def _replay(self) -> int:
        """Apply the journal's entries after the restored step (:mod:`~tapekit.training.rl._journal`):
        each step's update on its recorded rows, checked against the recorded weights digest;
        returns how many steps were replayed."""
        from tapekit.errors import TrainingError
        from tapekit.training.rl._journal import entries_after, weights_digest

        replayed = 0
        began = time.perf_counter()
        for entry in entries_after(self.out, self.step):
            self.model.eval()  # as a sync step trains: right after its rollouts, in eval mode
            self._update(entry.rows)
            got = weights_digest(self.model)
            if got != entry.weights:
                raise TrainingError(
                    f"journal step {entry.step} of {self.out} does not reproduce: the weights after its "
                    f"update are {got}, the journal says {entry.weights} (another initial model, torch "
                    "version, device or thread count than the run's). To go on from the last step that "
                    f"did reproduce ({self.step}) with new rollouts, move journal/step-{entry.step:06d}."
                    "json.gz and the later entries away"
                )
            self.sampler.load_state_dict(entry.sampler)
            entry.restore_rng()
            self.step = entry.step
            self.result.history.append(RLStepRecord.from_log(entry.record, seconds=entry.seconds))
            self.result.refused = entry.refused
            self.attempt = max(self.attempt, entry.attempt + 1)
            replayed += 1
        if replayed:
            print(
                f"rl: replayed {replayed} step(s) from {self.out / 'journal'} in "
                f"{time.perf_counter() - began:.0f} s (weights reproduced), now at step {self.step}",
                flush=True,
            )
        return replayed

    def _rewrite_log(self) -> None:
        path = self.out / LOG
        tmp = path.with_name(LOG + ".tmp")
        tmp.write_text("".join(json.dumps(r.to_log()) + "\n" for r in self.result.history))
        tmp.replace(path)

    def rollouts(self, policy: Any, step: int) -> RolloutBatch:
        """The step's rollouts, with ``resample_rounds`` more rounds for groups without a signal."""
        wanted = self.config.rollouts
        with self.lock:
            tasks = self.dist.share(self.sampler.sample(wanted.tasks_per_step))
        version = policy.activate()  # the newest published version samples (and is recorded)
        batch = self._collect(policy, step, version, tasks, 0)
        for extra in range(1, wanted.resample_rounds + 1):
            missing = wanted.tasks_per_step - live_groups(batch, self.rl.group_key)
            if missing <= 0:
                break
            with self.lock:
                more = self.sampler.sample(missing)
            first = len(batch.tapes) // wanted.group_size  # the step's tasks so far
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
            group_size=self.config.rollouts.group_size,
            step=step,
            policy_version=version,
            store=self.store,
            run=self.dist.run_name(self.config.run_name),
            attempt=self.attempt,
            max_loops=self.config.rollouts.max_loops,
            batcher=policy.batcher,
            seed=self.dist.seed(self.config.seed * 1_000_003 + step * 7919 + round_ * 104_729),
            first_index=first_index,
        )

    def _update(
        self, rows: list[dict[str, Any]]
    ) -> tuple[RLStepStats | None, RLBatch | None, dict[str, float]]:
        """The GRPO update of the step after ``self.step`` steps on ``rows`` (``train_on``'s result)."""
        return self.dist.train_on(
            self.model,
            self.optimizer,
            rows,
            self.rl,
            self.step,  # the policy version: one per RL step
            self.ref_model,
            self.config.grpo.ppo_epochs,
            self.config.grpo.minibatches,
        )

    def train(self, batch: RolloutBatch, started: float) -> None:
        version = self.step  # one policy version per RL step: the version is the step count
        self.rows = batch.rows  # for the journal (written with the step's checkpoint)
        stats, full, arm_rewards = self._update(batch.rows)
        with self.lock:
            self.sampler.update(arm_rewards)
            record = step_record(
                version,
                batch,
                stats,
                full,
                self.sampler,
                seconds=time.perf_counter() - self.began,
                step_seconds=time.perf_counter() - started,
                scorer_names=list(self.setup.scorers),
            )
        record = self.dist.merge_record(record, batch, full)
        self.step += 1
        self.result.history.append(record)
        if self.dist.is_main:  # several processes: one log, rank 0's
            with (self.out / LOG).open("a") as f:
                f.write(json.dumps(record.to_log()) + "\n")
        if self.callbacks:  # rank 0's answer stops every rank
            reason = notify(self.callbacks, record)
            self.result.stopped = self.dist.gather(reason)[0] if self.dist.world > 1 else reason

    @property
    def done(self) -> bool:
        """Whether the run has done ``config.steps`` steps or a callback stopped it."""
        return self.step >= self.config.steps or self.result.stopped is not None

    def checkpoint(self, journal: bool = True) -> None:
        """The step's journal entry (``config.journal``), then its checkpoint (``config.checkpoint``)."""
        from tapekit.training.rl._checkpoint import save_checkpoint

        if not self.dist.is_main:
            return
        if journal and self.config.journal and self.result.history:
            self._journal()
        if not self.config.checkpoint:
            return
        meta = {
            "history": [r.to_log() for r in self.result.history],
            "seconds": [r.seconds for r in self.result.history],
            "refused": self.result.refused,
            "attempt": self.attempt,
        }
        save_checkpoint(self.out, self.step, self.model, self.optimizer, self.sampler, meta)

    def _journal(self) -> None:
        from tapekit.training.rl._journal import JournalEntry, rng_states, weights_digest, write_entry

        torch_rng, python_rng = rng_states()
        last = self.result.history[-1]
        entry = JournalEntry(
            step=self.step,
            rows=self.rows,
            record=last.to_log(),
            seconds=last.seconds,
            sampler=self.sampler.state_dict(),
            torch_rng=torch_rng,
            python_rng=python_rng,
            weights=weights_digest(self.model),
            attempt=self.attempt,
            refused=self.result.refused,
        )
        write_entry(self.out, entry)

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
    ``output_dir/rollouts.db``). ``callbacks`` (:class:`~tapekit.training.callbacks.StepCallback`)
    see each step's :class:`~tapekit.training.rl.RLStepRecord` as it is logged and can stop the
    run after any step (``StopAfter(seconds=...)``, ``EarlyStopping(...)``; the reason is
    ``result.stopped``). ``on_step``, a function of the record's log line (a dict), is
    deprecated: give a callback. Under ``accelerate launch``/``torchrun`` the processes train
    data-parallel (:mod:`tapekit.training.rl._dist`).
    """
    from tapekit.store import open_store

    hooks = list(callbacks or ())
    if on_step is not None:
        warnings.warn(
            "train_rl(on_step=...) is deprecated: pass callbacks=[a StepCallback], whose on_step gets "
            "the typed RLStepRecord (record.to_log() is the dict on_step got)",
            DeprecationWarning,
            stacklevel=2,
        )
        hooks.insert(0, _DictHook(on_step))
    dist = RLDist.from_env(config.device)
    try:
        dist.check(config)
        if config.report_to and dist.is_main:  # a missing tracker package fails here, before any work
            hooks.append(ReportTo(config.report_to, config.output_dir, config.run_name))
        if config.lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, lora_config(config))
        device = dist.device(config)
        model = model.to(device)
        if config.release_freed_memory and device.startswith("cpu"):
            from tapekit._heap import release_freed_memory

            release_freed_memory()
        dist.sync_start(model)
        owned = store is None
        if store is None:
            Path(config.output_dir).mkdir(parents=True, exist_ok=True)
            store = open_store(str(Path(config.output_dir) / dist.store_name()))
        run = _Run(setup, model, tokenizer, config, store, dist, hooks)
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
