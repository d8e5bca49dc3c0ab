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

from tapekit.training.rl._advantages import GroupAdvantages as GroupAdvantages
from tapekit.training.rl._advantages import group_advantages as group_advantages
from tapekit.training.rl._advantages import mean_abs_by_key as mean_abs_by_key
from tapekit.training.rl._batch import RLBatch as RLBatch
from tapekit.training.rl._batch import group_minibatches as group_minibatches
from tapekit.training.rl._batch import make_rl_batch as make_rl_batch
from tapekit.training.rl._config import CurriculumConfig as CurriculumConfig
from tapekit.training.rl._config import GRPOConfig as GRPOConfig
from tapekit.training.rl._config import RLConfig as RLConfig
from tapekit.training.rl._config import RLRunConfig as RLRunConfig
from tapekit.training.rl._config import RolloutConfig as RolloutConfig
from tapekit.training.rl._config import make_sampler as make_sampler
from tapekit.training.rl._loop import RLRunResult as RLRunResult
from tapekit.training.rl._loop import RLSetup as RLSetup
from tapekit.training.rl._loop import train_rl as train_rl
from tapekit.training.rl._loss import AGGREGATIONS as AGGREGATIONS
from tapekit.training.rl._loss import Aggregation as Aggregation
from tapekit.training.rl._loss import PolicyLoss as PolicyLoss
from tapekit.training.rl._loss import aggregate as aggregate
from tapekit.training.rl._loss import k3_kl as k3_kl
from tapekit.training.rl._loss import policy_loss as policy_loss
from tapekit.training.rl._loss import token_logprobs as token_logprobs
from tapekit.training.rl._policies import LlamaCppPolicy as LlamaCppPolicy
from tapekit.training.rl._policies import LocalPolicy as LocalPolicy
from tapekit.training.rl._policies import RemotePolicy as RemotePolicy
from tapekit.training.rl._policies import RolloutPolicy as RolloutPolicy
from tapekit.training.rl._policies import make_policy as make_policy
from tapekit.training.rl._record import RLStepRecord as RLStepRecord
from tapekit.training.rl._rollouts import RolloutBatch as RolloutBatch
from tapekit.training.rl._rollouts import collect_rollouts as collect_rollouts
from tapekit.training.rl._rollouts import live_groups as live_groups
from tapekit.training.rl._rollouts import merge_batches as merge_batches
from tapekit.training.rl._rollouts import rollout_rows as rollout_rows
from tapekit.training.rl._rollouts import rollout_tags as rollout_tags
from tapekit.training.rl._rollouts import score_value as score_value
from tapekit.training.rl._step import RLStepStats as RLStepStats
from tapekit.training.rl._step import grpo_step as grpo_step
from tapekit.training.rl._step import merge_stats as merge_stats
from tapekit.training.rl._step import reference_logprobs as reference_logprobs
