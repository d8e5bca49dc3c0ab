"""What one RL step did: :class:`RLStepRecord`, the one shape of it.

The loop makes one record per step (:func:`step_record`), writes it to ``rl_log.jsonl`` as
:meth:`RLStepRecord.to_log` (the line's keys and values are those of every log written so far:
``step`` counts from 0, ``reward_mean``, ``score_<scorer>``, ``train_tokens``, ...), hands it
to the step callbacks (an :class:`RLStepRecord` is a
:class:`~tapekit.training.callbacks.StepRecord`: ``value()``, ``scalars()`` and ``metrics``
work as for SFT and DPO) and keeps it in ``RLRunResult.history``. :meth:`RLStepRecord.from_log`
reads a log line back (resuming a run, or a committed experiment's log).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from tapekit.training.callbacks import StepRecord

if TYPE_CHECKING:
    from tapekit.evaluate import Task
    from tapekit.training.rl._batch import RLBatch
    from tapekit.training.rl._rollouts import RolloutBatch
    from tapekit.training.rl._step import RLStepStats


# The record's fields in the order of a log line (``step`` first), and the two whose log name
# is not their own; ``grad_norm``, ``processes`` and ``category_rewards`` (logs from before
# 2026-11-28 lack it) are written only when known.
_LOG_ORDER = (
    "policy_version",
    "rollout_version",
    "policy_lag",
    "reward",
    "reward_std",
    "scores",
    "scored_rollouts",
    "zero_adv_share",
    "groups",
    "rollout_seconds",
    "rollout_tokens_per_s",
    "rollouts",
    "rollout_prompt_tokens",
    "rollout_output_tokens",
    "failed_rollouts",
    "environment_failures",
    "step_seconds",
    "sampler_values",
    "sampler_probs",
    "categories",
    "category_rewards",
    "loss",
    "clip_fraction",
    "ratio_mean",
    "kl",
    "tokens",
    "train_tokens_per_s",
    "grad_norm",
    "train_input_tokens",
    "processes",
)
_LOG_NAME = {"reward": "reward_mean", "tokens": "train_tokens"}
_FIELD_NAME = {log: name for name, log in _LOG_NAME.items()}
_WHEN_KNOWN = {"grad_norm", "processes", "category_rewards"}


class RLStepRecord(StepRecord):
    """What one RL step did (``trainer="rl"``; ``step`` counts the steps done, 1 after the first).

    Besides :class:`~tapekit.training.callbacks.StepRecord`'s fields (``reward``: the rollouts'
    mean reward, ``None`` when the environment failed every rollout; ``loss``; ``tokens``: the
    tokens trained on; ``step_seconds``: rollouts and training):

    - versions: ``policy_version`` (trained this step), ``rollout_version`` (sampled the
      rollouts), ``policy_lag`` (their difference; 0 in sync mode);
    - rollouts: ``reward_std``, ``scores`` (each scorer's mean), ``rollouts`` (tapes),
      ``scored_rollouts`` (those the environment did not fail), ``failed_rollouts``,
      ``environment_failures``, ``rollout_seconds``, ``rollout_tokens_per_s`` (sampled),
      ``rollout_prompt_tokens``, ``rollout_output_tokens``;
    - groups: ``groups`` (trained on), ``zero_adv_share``, ``categories`` (tasks drawn per
      category), ``category_rewards`` (the mean reward of each category's scored rollouts),
      the sampler's ``sampler_values`` and ``sampler_probs``;
    - training: ``clip_fraction``, ``ratio_mean``, ``kl``, ``train_tokens_per_s``, ``grad_norm``
      (``None`` when the step trained nothing), ``train_input_tokens``;
    - ``processes``: the processes of a data-parallel run (``None``: one).

    ``metrics`` is the record's log line (:meth:`to_log`), made with the record: it is what
    :meth:`scalars` flattens for the trackers. ``record["reward_mean"]`` (a log key) still reads,
    deprecated: read the field.
    """

    policy_version: int
    rollout_version: int
    policy_lag: int
    reward_std: float | None = None
    scores: dict[str, float | None] = Field(default_factory=dict)
    scored_rollouts: int = 0
    zero_adv_share: float
    groups: int
    rollout_seconds: float
    rollout_tokens_per_s: float
    rollouts: int
    rollout_prompt_tokens: int = 0
    rollout_output_tokens: int = 0
    failed_rollouts: int = 0
    environment_failures: int = 0
    sampler_values: dict[str, float] = Field(default_factory=dict)
    sampler_probs: dict[str, float] = Field(default_factory=dict)
    categories: dict[str, int] = Field(default_factory=dict)
    category_rewards: dict[str, float] | None = None
    clip_fraction: float = 0.0
    ratio_mean: float = 1.0
    kl: float = 0.0
    train_tokens_per_s: float = 0.0
    grad_norm: float | None = None
    train_input_tokens: int = 0
    processes: int | None = None

    @model_validator(mode="after")
    def _metrics_are_the_log_line(self) -> RLStepRecord:
        self.metrics = self.to_log()
        return self

    def to_log(self) -> dict[str, Any]:
        """The record as a line of ``rl_log.jsonl`` (JSON-ready; ``step`` counts from 0)."""
        line: dict[str, Any] = {"step": self.step - 1}
        for name in _LOG_ORDER:
            value = getattr(self, name)
            if name == "scores":
                line.update({f"score_{scorer}": mean for scorer, mean in value.items()})
            elif value is not None or name not in _WHEN_KNOWN:
                line[_LOG_NAME.get(name, name)] = value
        return line

    @classmethod
    def from_log(cls, line: Mapping[str, Any], seconds: float = 0.0) -> RLStepRecord:
        """The record of a log line (``seconds``, the run's time at that step, is not logged)."""
        fields: dict[str, Any] = {"scores": {}}
        for key, value in line.items():
            if key.startswith("score_"):
                fields["scores"][key.removeprefix("score_")] = value
            else:
                fields[_FIELD_NAME.get(key, key)] = value
        fields["step"] = int(line["step"]) + 1
        return cls(trainer="rl", seconds=seconds, **fields)

    def __getitem__(self, key: str) -> Any:
        """The log line's ``key`` (deprecated: read the record's fields)."""
        warnings.warn(
            f"RLStepRecord[{key!r}] is deprecated: read the record's fields (to_log() is the log line)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.metrics[key]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and population standard deviation; ``(None, None)`` for no values (a step whose
    every rollout the environment failed has no reward to report, not a reward of 0)."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def mean_by_category(pairs: Iterable[tuple[str, float]]) -> dict[str, float]:
    """The mean reward of each category of ``(category, reward)`` pairs, categories sorted."""
    found: dict[str, list[float]] = {}
    for category, reward in pairs:
        found.setdefault(category, []).append(reward)
    return {c: sum(found[c]) / len(found[c]) for c in sorted(found)}


def _task_counts(tasks: Sequence[Task]) -> dict[str, int]:
    """How many distinct tasks of each category a step drew."""
    unique = {t.id: t.category for t in tasks}
    return {c: sum(1 for v in unique.values() if v == c) for c in sorted(set(unique.values()))}


def step_record(
    version: int,
    rollouts: RolloutBatch,
    stats: RLStepStats | None,
    full: RLBatch | None,
    sampler: Any,
    *,
    seconds: float,
    step_seconds: float,
    scorer_names: Sequence[str],
) -> RLStepRecord:
    """The record of the step that trained policy ``version`` (the ``version + 1``-th step) on
    ``rollouts``: ``stats`` of its GRPO steps (None: it trained nothing), ``full`` the batch of
    all its rows (None: no rows), ``sampler`` after its update, ``seconds`` since the run began."""
    mean, std = mean_std(rollouts.rewards)  # of the kept tapes: the environment's failures say nothing
    trained: dict[str, Any] = {}
    if stats is not None:
        trained = {
            "loss": stats.loss,
            "clip_fraction": stats.clip_fraction,
            "ratio_mean": stats.ratio_mean,
            "kl": stats.kl,
            "tokens": stats.tokens,
            "train_tokens_per_s": stats.tokens_per_s,
            "grad_norm": stats.grad_norm,
            "train_input_tokens": stats.input_tokens,
        }
    return RLStepRecord(
        trainer="rl",
        step=version + 1,
        seconds=seconds,
        step_seconds=step_seconds,
        policy_version=version,
        rollout_version=rollouts.policy_version,
        policy_lag=version - rollouts.policy_version,
        reward=mean,
        reward_std=std,
        scores={name: mean_std(rollouts.scores(name))[0] for name in scorer_names},
        scored_rollouts=len(rollouts.rewards),
        zero_adv_share=full.groups.zero_share if full is not None else 1.0,
        # the groups GRPO trains on: a task whose every rollout the environment failed has none
        groups=len(rollouts.kept_task_ids),
        rollout_seconds=rollouts.seconds,
        rollout_tokens_per_s=rollouts.tokens_per_s,
        rollouts=len(rollouts.tapes),
        rollout_prompt_tokens=rollouts.prompt_tokens,
        rollout_output_tokens=rollouts.output_tokens,
        failed_rollouts=rollouts.failed,
        environment_failures=rollouts.environment_failures,
        sampler_values=sampler.values(),
        sampler_probs=sampler.probabilities(),
        categories=_task_counts(rollouts.tasks),
        category_rewards=mean_by_category(rollouts.category_rewards),
        **{"loss": 0.0, "tokens": 0, **trained},
    )
