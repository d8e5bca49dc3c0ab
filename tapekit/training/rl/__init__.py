"""On-policy RL (GRPO) on the agent's own rollouts: a trainer and its config, like SFT and DPO.

- **The run.** :func:`train_rl` (the trainer) takes an :class:`RLSetup` (the task side: the
  agent on the policy LLM, the environment, the tasks, the scorers and which one is the reward)
  and an :class:`RLRunConfig`: a :class:`~tapekit.training.config.TrainConfig` with the
  sections ``grpo`` (:class:`GRPOConfig`), ``rollouts`` (:class:`RolloutConfig`) and
  ``curriculum`` (:class:`CurriculumConfig`), each field defined once. Each step's
  :class:`RLStepRecord` goes to ``output_dir/rl_log.jsonl``, to the step callbacks and to
  :class:`RLRunResult`'s ``history``.
- **One step.** :func:`make_rl_batch` pads sample rows and gives each its tape's group
  advantage (:func:`group_advantages`); :func:`grpo_step` makes one optimiser step of the
  clipped loss (:func:`policy_loss`) under an :class:`RLConfig` and returns its
  :class:`RLStepStats`.
- **Rollouts.** :func:`collect_rollouts` runs G attempts per task through the batch runner,
  scores and stores them; :func:`rollout_rows` makes their token-exact samples. Where they are
  sampled: a :class:`RolloutPolicy` (:class:`LocalPolicy`, :class:`RemotePolicy` on vLLM
  servers, :class:`LlamaCppPolicy`).

The task samplers (the curriculum) are in :mod:`tapekit.training.curriculum`. Importing this
package loads no torch: the functions import it when they run.
"""

from __future__ import annotations

from tapekit.training.rl._advantages import GroupAdvantages, group_advantages, mean_abs_by_key
from tapekit.training.rl._batch import RLBatch, group_minibatches, make_rl_batch
from tapekit.training.rl._config import (
    CurriculumConfig,
    GRPOConfig,
    RLConfig,
    RLRunConfig,
    RolloutConfig,
    make_sampler,
)
from tapekit.training.rl._loop import RLRunResult, RLSetup, train_rl
from tapekit.training.rl._loss import (
    AGGREGATIONS,
    Aggregation,
    PolicyLoss,
    aggregate,
    k3_kl,
    policy_loss,
    token_logprobs,
)
from tapekit.training.rl._policies import (
    LlamaCppPolicy,
    LocalPolicy,
    RemotePolicy,
    RolloutPolicy,
    make_policy,
)
from tapekit.training.rl._record import RLStepRecord
from tapekit.training.rl._rollouts import (
    RolloutBatch,
    collect_rollouts,
    live_groups,
    merge_batches,
    rollout_rows,
    rollout_tags,
    score_value,
)
from tapekit.training.rl._step import RLStepStats, grpo_step, merge_stats, reference_logprobs

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "CurriculumConfig",
    "GRPOConfig",
    "GroupAdvantages",
    "LlamaCppPolicy",
    "LocalPolicy",
    "PolicyLoss",
    "RLBatch",
    "RLConfig",
    "RLRunConfig",
    "RLRunResult",
    "RLSetup",
    "RLStepRecord",
    "RLStepStats",
    "RemotePolicy",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutPolicy",
    "aggregate",
    "collect_rollouts",
    "group_advantages",
    "group_minibatches",
    "grpo_step",
    "k3_kl",
    "live_groups",
    "make_policy",
    "make_rl_batch",
    "make_sampler",
    "mean_abs_by_key",
    "merge_batches",
    "merge_stats",
    "policy_loss",
    "reference_logprobs",
    "rollout_rows",
    "rollout_tags",
    "score_value",
    "token_logprobs",
    "train_rl",
]
