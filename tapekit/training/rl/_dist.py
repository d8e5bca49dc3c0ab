"""Data-parallel RL over several processes (``accelerate launch`` or ``torchrun``, one per device).

:func:`~tapekit.training.rl.train_rl` reads the launcher's ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``
and, with more than one process, runs as follows (one process changes nothing):

- **Tasks.** Every rank seeds its task sampler alike and draws the same ``rollouts.tasks_per_step``
  tasks; rank ``r`` takes ``tasks[r::world]`` (disjoint positions of the draw; a task drawn
  twice in a step can land on two ranks, as it runs twice in one process). Each rank makes its
  own rollouts (sampling seed offset by the rank) and rows.
- **Gradients.** After a rank's backward passes, one ``all_reduce`` of its flattened gradients
  (each scaled by the batch's loss normaliser: its tokens, sequences or rows, per the
  aggregation) and of the normaliser makes every rank's gradient the weighted mean of all
  ranks'. That is the gradient of the loss over the union of the ranks' rows (GRPO's
  advantages are per group, and a group never spans ranks), so clipping and the optimiser step
  see the same numbers on every rank and the weights stay identical. This is an explicit
  ``all_reduce`` rather than DDP or ``accelerate.Accelerator``: a GRPO step makes several
  backward passes (micro-batches), and a rank may have nothing to train on in a step (all its
  groups scored alike) - DDP's per-backward reduction would then need ``no_sync`` and would
  hang on the uneven number of backward passes, and its plain mean would weight a rank's few
  tokens like another's many. Here a rank without rows joins the reduction with zero
  gradients and weight, so every rank makes the same ``ppo_epochs x minibatches`` steps.
- **Curriculum and log.** The groups' mean |advantage| (the sampler's arm rewards) and each
  rank's step figures are gathered, so every rank updates the sampler identically (checked:
  the ranks' sampler values must agree every step) and the record is that of the whole step.
- **Files.** Only rank 0 writes ``rl_log.jsonl``, the checkpoints and ``final/``; all ranks
  resume from the same checkpoint (``output_dir`` must be shared). Each rank stores its
  rollouts in its own SQLite file, ``rollouts-r<rank>.db``, under the run name
  ``<run_name>-r<rank>`` (tags ``rl:<run_name>-r<rank>:...``): concurrent writers of one SQLite
  file would wait on its lock every step, and the distinct run names keep tape ids apart when
  one store (PostgreSQL) is shared. At the end the ranks compare weight hashes and sampler
  states (an error if they differ) and rank 0 writes them to ``ranks.json``. Each rank then
  leaves the process group it joined (``RLDist.close``), even after an error: a process that
  exits with a gloo group up can abort while the interpreter finalises.

``mode="async"`` is refused with several processes (its producer thread's staleness refusals
depend on timing, so the ranks would disagree on the number of steps).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapekit.errors import TrainingError
from tapekit.training._hf import device_of
from tapekit.training._trace import weights_hash
from tapekit.training.rl._advantages import mean_abs_by_key
from tapekit.training.rl._batch import RLBatch, make_rl_batch, signal_minibatches
from tapekit.training.rl._config import RLConfig, RLRunConfig
from tapekit.training.rl._record import RLStepRecord, mean_by_category, mean_std
from tapekit.training.rl._step import RLStepStats, grpo_step
from tapekit.training.rl._step import merge_stats as merge_step_stats

RANK_SEED = 104_729  # a prime: rank r's rollouts are seeded seed + r * RANK_SEED
SAME = ("step", "policy_version", "rollout_version", "policy_lag", "sampler_values", "sampler_probs")
WEIGHTED = ("loss", "clip_fraction", "ratio_mean", "kl")


def batch_weight(batch: RLBatch, config: RLConfig) -> float:
    """The normaliser of ``batch``'s loss under ``config.aggregation`` (tokens, sequences with a
    token, or rows): the weight of its gradient in the average over ranks."""
    if config.aggregation == "token":
        return float(batch.loss_mask.sum().item())
    if config.aggregation == "sequence":
        return float((batch.loss_mask.sum(dim=1) > 0).sum().item())
    return float(batch.size)


def merge_records(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One step's record for the whole run from each rank's part (its local ``record``, its
    ``rewards``, ``scores`` by scorer, ``tasks`` as (id, category) pairs, ``category_rewards``
    as (category, reward) pairs of its scored rollouts, ``kept_tasks`` (the
    ids of the groups trained on: tasks with a rollout the environment did not fail),
    ``zero_groups`` and ``n_groups`` counts, ``output_tokens``): rewards and scores over all
    rollouts, the training figures token-weighted, throughputs added up, times the slowest rank's. Raises
    ``RuntimeError`` if the ranks disagree on what must be equal (step, versions, sampler)."""
    first = parts[0]["record"]
    for rank, part in enumerate(parts[1:], start=1):
        differ = [k for k in SAME if part["record"].get(k) != first.get(k)]
        if differ:
            raise RuntimeError(f"data-parallel RL: rank {rank} disagrees with rank 0 on {differ}")
    record = dict(first)
    rewards = [r for p in parts for r in p["rewards"]]
    record["reward_mean"], record["reward_std"] = mean_std(rewards)
    record["scored_rollouts"] = len(rewards)
    for name in parts[0]["scores"]:
        values = [v for p in parts for v in p["scores"][name]]
        record[f"score_{name}"] = mean_std(values)[0]
    n_groups = sum(p["n_groups"] for p in parts)
    record["zero_adv_share"] = sum(p["zero_groups"] for p in parts) / n_groups if n_groups else 1.0
    unique = {task_id: category for p in parts for task_id, category in p["tasks"]}
    record["groups"] = len({task_id for p in parts for task_id in p["kept_tasks"]})
    record["categories"] = {
        c: sum(1 for v in unique.values() if v == c) for c in sorted(set(unique.values()))
    }
    record["category_rewards"] = mean_by_category(
        (str(c), float(r)) for p in parts for c, r in p.get("category_rewards", ())
    )
    seconds = max(p["record"]["rollout_seconds"] for p in parts)
    record["rollout_seconds"] = seconds
    record["rollout_tokens_per_s"] = sum(p["output_tokens"] for p in parts) / seconds if seconds else 0.0
    record["step_seconds"] = max(p["record"]["step_seconds"] for p in parts)
    record["failed_rollouts"] = sum(p["record"]["failed_rollouts"] for p in parts)
    record["environment_failures"] = sum(p["record"].get("environment_failures", 0) for p in parts)
    for key in ("rollouts", "rollout_prompt_tokens", "rollout_output_tokens", "train_input_tokens"):
        record[key] = sum(int(p["record"].get(key, 0)) for p in parts)
    tokens = sum(p["record"]["train_tokens"] for p in parts)
    if tokens:
        for key in WEIGHTED:
            record[key] = sum(p["record"][key] * p["record"]["train_tokens"] for p in parts) / tokens
    record["train_tokens"] = tokens
    record["train_tokens_per_s"] = sum(p["record"]["train_tokens_per_s"] for p in parts)
    norms = [p["record"]["grad_norm"] for p in parts if "grad_norm" in p["record"]]
    if norms:  # the clipped gradient is the all-reduced one: equal on every rank that trained
        record["grad_norm"] = max(norms)
    record["processes"] = len(parts)
    return record


@dataclass
class RLDist:
    """This process's place in a data-parallel RL run (``world == 1``: a plain run)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this run joined the process group, so it leaves it (close)

    @classmethod
    def from_env(cls, device: str = "cpu") -> RLDist:
        """The run the launcher started (``WORLD_SIZE`` > 1), joining its process group (gloo on
        CPU, NCCL on CUDA) unless one is up; one process when the variables are absent."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch
        import torch.distributed as dist

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = device in ("cuda", "auto") and torch.cuda.is_available()  # no CUDA: RLDist.device says
        if cuda:
            torch.cuda.set_device(local_rank)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend="nccl" if cuda else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), local_rank, owns_group=owns)

    def close(self) -> None:
        """Leave the process group this run joined (none joined by the caller is touched).

        A process that exits with a gloo group still up can abort (SIGABRT) while the
        interpreter finalises: gloo's worker threads still hold tensors whose release needs the
        GIL. Leaving it explicitly, before the process ends, avoids that."""
        if self.world > 1 and self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.owns_group = False

    @property
    def is_main(self) -> bool:
        """Whether this process writes the log, checkpoints and result (rank 0)."""
        return self.rank == 0

    def device(self, config: RLRunConfig) -> str:
        """The torch device of this rank for ``config.device`` (``cuda:<local rank>`` on a GPU)."""
        return f"cuda:{self.local_rank}" if device_of(config) == "cuda" else "cpu"

    def check(self, config: RLRunConfig) -> None:
        """Refuse settings a data-parallel run cannot honour."""
        if self.world == 1:
            return
        if config.journal:
            raise TrainingError(
                f"journal runs in one process only ({self.world} were started): each rank's rows "
                "would be needed to replay a step; use journal: false and keep the checkpoints"
            )
        if config.mode == "async":
            raise TrainingError(
                f"mode='async' runs in one process only ({self.world} were started): use mode: sync"
            )
        if config.rollouts.resample_rounds:
            raise TrainingError(
                f"rollouts.resample_rounds runs in one process only ({self.world} were started): the "
                "ranks would draw different numbers of tasks; use resample_rounds: 0"
            )
        if config.grpo.group_key != "task_id":
            raise TrainingError(
                f"grpo.group_key={config.grpo.group_key!r} runs in one process only ({self.world} were "
                "started): a category's tasks are spread over the ranks, which compare rewards apart"
            )
        if config.rollouts.tasks_per_step < self.world:
            raise TrainingError(
                f"rollouts.tasks_per_step={config.rollouts.tasks_per_step} is fewer than the {self.world} "
                "processes: every process needs at least one task per step"
            )

    def share(self, tasks: Sequence[Any]) -> list[Any]:
        """This rank's share of a step's tasks: positions ``rank, rank + world, ...``."""
        return list(tasks[self.rank :: self.world])

    def run_name(self, run: str) -> str:
        """The run name of this rank's rollouts (``<run>-r<rank>`` with several processes)."""
        return run if self.world == 1 else f"{run}-r{self.rank}"

    def store_name(self) -> str:
        """The file name of this rank's rollout store."""
        return "rollouts.db" if self.world == 1 else f"rollouts-r{self.rank}.db"

    def seed(self, seed: int) -> int:
        """This rank's rollout sampling seed for a step seeded ``seed``."""
        return seed + self.rank * RANK_SEED

    def gather(self, value: Any) -> list[Any]:
        """``value`` from every rank, in rank order (picklable objects)."""
        if self.world == 1:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def sync_start(self, model: Any) -> None:
        """Give every rank rank 0's weights (a LoRA adapter's random init differs by process)."""
        if self.world == 1:
            return
        import torch
        import torch.distributed as dist

        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def policy(self, policy: Any) -> Any:
        """The rollout policy for this rank: a remote one (vLLM servers) wrapped so that rank 0
        alone publishes; an in-process one as it is (each rank samples on its own copy)."""
        from tapekit.training.rl._policies import RemotePolicy

        return RankPolicy(policy, self) if self.world > 1 and isinstance(policy, RemotePolicy) else policy

    def _reduce_grads(self, optimizer: Any, weight: float) -> float:
        """Replace every gradient by the ``weight``-weighted mean over the ranks (a missing one
        counts as zeros); returns the total weight (0: no rank had anything to train on)."""
        import torch
        import torch.distributed as dist

        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.detach().reshape(-1).float() * weight for g in grads])
        flat = torch.cat([flat, torch.tensor([weight], dtype=flat.dtype, device=flat.device)])
        dist.all_reduce(flat)
        total = float(flat[-1].item())
        offset = 0
        for p in params:
            n = p.numel()
            part = (
                flat[offset : offset + n] / total
                if total > 0
                else torch.zeros_like(flat[offset : offset + n])
            )
            p.grad = part.view_as(p).to(p.dtype)
            offset += n
        return total

    def _idle_step(self, optimizer: Any, rl: RLConfig) -> None:
        """A step with no rows here: zero gradients into the reduction, then the same clipping
        and optimiser step as the other ranks (none if no rank had rows)."""
        import math

        import torch

        optimizer.zero_grad()
        if self._reduce_grads(optimizer, 0.0) <= 0:
            return
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, rl.max_grad_norm if rl.max_grad_norm > 0 else math.inf)
        optimizer.step()

    def _arm_rewards(self, full: RLBatch | None) -> dict[str, float]:
        """SEC's arm rewards over every rank's groups: each category's mean group |advantage|."""
        if self.world == 1:
            return mean_abs_by_key(full.groups.group_mean_abs, full.group_category) if full else {}
        local = []
        if full is not None and full.group_category:
            local = [(full.group_category[g], v) for g, v in full.groups.group_mean_abs.items()]
        sums: dict[str, list[float]] = {}
        for part in self.gather(local):
            for category, value in part:
                sums.setdefault(category, []).append(value)
        return {c: sum(v) / len(v) for c, v in sums.items()}

    def _grad_sync(self, optimizer: Any, batch: RLBatch, rl: RLConfig) -> Callable[[], None] | None:
        """What replaces each gradient by the mean over the ranks, weighted by ``batch``'s loss
        normaliser (None with one process)."""
        if self.world == 1:
            return None
        weight = batch_weight(batch, rl)

        def sync() -> None:
            self._reduce_grads(optimizer, weight)

        return sync

    def train_on(
        self,
        model: Any,
        optimizer: Any,
        rows: list[dict[str, Any]],
        rl: RLConfig,
        version: int,
        ref_model: Any,
        epochs: int = 1,
        minibatches: int = 1,
    ) -> tuple[RLStepStats | None, RLBatch | None, dict[str, float]]:
        """``epochs`` x ``minibatches`` GRPO steps on this rank's rows of the groups that have a
        signal; the batch of all its rows (None: no rows) and the sampler's arm rewards (every
        rank's groups) either way. With several ranks each gradient is the weighted mean over
        them, and a rank with fewer minibatches joins the others' steps with zero gradient, so
        every rank makes the same ``epochs x minibatches`` optimiser steps."""
        full = make_rl_batch(rows, rl) if rows else None
        arm_rewards = self._arm_rewards(full)
        parts: list[RLBatch | None] = [*signal_minibatches(rows, full, rl, minibatches)]
        if self.world > 1:
            parts += [None] * (minibatches - len(parts))
        stats = []
        for _ in range(epochs):
            for batch in parts:
                if batch is None:
                    self._idle_step(optimizer, rl)
                    continue
                sync = self._grad_sync(optimizer, batch, rl)
                stats.append(
                    grpo_step(
                        model,
                        optimizer,
                        batch,
                        rl,
                        ref_model=ref_model,
                        policy_version=version,
                        grad_sync=sync,
                    )
                )
        return (merge_step_stats(stats) if stats else None), full, arm_rewards

    def merge_record(self, record: RLStepRecord, rollouts: Any, full: RLBatch | None) -> RLStepRecord:
        """The step's record over every rank (``record`` itself with one process)."""
        if self.world == 1:
            return record
        part = {
            "record": record.to_log(),
            "rewards": rollouts.rewards,
            "scores": {n: rollouts.scores(n) for n in record.scores},
            "tasks": [(t.id, t.category) for t in rollouts.tasks],
            "kept_tasks": sorted(rollouts.kept_task_ids),
            "category_rewards": rollouts.category_rewards,
            "zero_groups": len(full.groups.zero_groups) if full is not None else 0,
            "n_groups": len(full.groups.groups) if full is not None else 0,
            "output_tokens": rollouts.output_tokens,
        }
        return RLStepRecord.from_log(merge_records(self.gather(part)), seconds=record.seconds)

    def finish(self, model: Any, sampler: Any, out: Path) -> None:
        """Check that every rank ends with the same weights and sampler state (``RuntimeError``
        if not); rank 0 writes them to ``out/ranks.json``."""
        if self.world == 1:
            return
        mine = {"rank": self.rank, "weights": weights_hash(model), "sampler": sampler.state_dict()}
        ranks = self.gather(mine)
        if self.is_main:
            (out / "ranks.json").write_text(json.dumps(ranks) + "\n")
        differ = [
            r["rank"]
            for r in ranks
            if (r["weights"], r["sampler"]) != (ranks[0]["weights"], ranks[0]["sampler"])
        ]
        if differ:
            raise RuntimeError(f"data-parallel RL: ranks {differ} ended with other weights or sampler state")


class RankPolicy:
    """A :class:`~tapekit.training.rl.RemotePolicy` shared by the ranks of a data-parallel
    run. Rank 0 publishes each version (saves the adapter, loads it on the servers, unloads old
    ones: once, not once per rank); every rank waits at a barrier until it is loaded, then sends
    its calls to it. No rank is still sampling from the version rank 0 retires: publishing
    follows the step's gradient reduction, which every rank reaches after its rollouts."""

    batcher: Any = None

    def __init__(self, inner: Any, dist: RLDist) -> None:
        self.inner, self.dist = inner, dist
        self.llm = inner.llm
        self.latest: int | None = None

    def publish(self, model: Any, version: int) -> None:
        """Rank 0 publishes ``version``; every rank returns once it is served."""
        if self.dist.is_main:
            self.inner.publish(model, version)
        self.latest = version
        self.dist.barrier()

    def activate(self) -> int:
        """Send the calls to the newest published version; return it."""
        if self.dist.is_main:
            return int(self.inner.activate())
        if self.latest is None:
            raise TrainingError("RankPolicy.activate: nothing was published yet")
        self.llm.serve(self.inner.lora_name(self.latest), str(self.latest))
        return self.latest

    def close(self) -> None:
        """Rank 0 unloads the servers' old adapters."""
        if self.dist.is_main:
            self.inner.close()
