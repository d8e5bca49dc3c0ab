"""Learning from tapes: token-exact samples, SFT and DPO trainers, on-policy RL, a tiny local model.

Every trainer is a config/trainer pair (:class:`SFTConfig` and :func:`train_sft`,
:class:`DPOConfig` and :func:`train_dpo`, :class:`RLRunConfig` and :func:`train_rl`, whose
parts are in :mod:`tapekit.training.rl`) and takes ``callbacks``: :class:`StepCallback` objects
that see each step's typed :class:`StepRecord` (RL's: :class:`RLStepRecord`) and can stop the
run (:class:`StopAfter`, :class:`EarlyStopping`). RL's config sections (:class:`GRPOConfig`,
:class:`RolloutConfig`, :class:`CurriculumConfig`), one GRPO step's parts (:class:`RLConfig`,
:func:`make_rl_batch`, :func:`group_advantages`, :func:`grpo_step`) and the curriculum's
:class:`SECSampler` are exported here too. Sweeps over hyperparameters: :func:`config_grid`
and :func:`sample_configs` make the configurations, :func:`run_sweep` runs each (configuration,
seed) once into a resumable JSONL file of :class:`SweepRow` (read back by :func:`read_sweep`),
and :func:`tapekit.evaluate.bootstrap_configs` analyses it. The tiny local model for tests is
:mod:`tapekit.testing.tiny`.

Importing this package is light: the trainers and their heavy dependencies (torch,
transformers, peft, trl, datasets; the ``train`` extra) load on first use of a name below.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Break",
    "CurriculumConfig",
    "DPOConfig",
    "Drift",
    "EarlyStopping",
    "GRPOConfig",
    "LocalPolicy",
    "LoraSettings",
    "PairSet",
    "PreferencePair",
    "RLConfig",
    "RLRunConfig",
    "RLRunResult",
    "RLSetup",
    "RLStepRecord",
    "RemotePolicy",
    "ReportTo",
    "RolloutBatch",
    "RolloutConfig",
    "SECSampler",
    "SFTConfig",
    "SampleConfig",
    "SampleSet",
    "StepCallback",
    "StepRecord",
    "StopAfter",
    "SweepRow",
    "TrainingError",
    "collect_rollouts",
    "config_grid",
    "drift_report",
    "group_advantages",
    "grpo_step",
    "iter_samples",
    "load_config",
    "make_rl_batch",
    "make_samples",
    "preference_pairs",
    "read_sweep",
    "rollout_rows",
    "run_sweep",
    "sample_configs",
    "train_dpo",
    "train_rl",
    "train_sft",
]

_WHERE = {
    "EarlyStopping": "tapekit.training.callbacks",
    "ReportTo": "tapekit.training.callbacks",
    "StepCallback": "tapekit.training.callbacks",
    "StepRecord": "tapekit.training.callbacks",
    "StopAfter": "tapekit.training.callbacks",
    "Break": "tapekit.training.samples",
    "Drift": "tapekit.training.samples",
    "SampleConfig": "tapekit.training.samples",
    "SampleSet": "tapekit.training.samples",
    "drift_report": "tapekit.training.samples",
    "iter_samples": "tapekit.training.samples",
    "make_samples": "tapekit.training.samples",
    "DPOConfig": "tapekit.training.config",
    "LoraSettings": "tapekit.training.config",
    "PairSet": "tapekit.training.dpo",
    "PreferencePair": "tapekit.training.dpo",
    "SFTConfig": "tapekit.training.config",
    "load_config": "tapekit.training.config",
    "preference_pairs": "tapekit.training.dpo",
    "TrainingError": "tapekit.errors",
    "train_dpo": "tapekit.training.dpo",
    "train_sft": "tapekit.training.sft",
    "RolloutBatch": "tapekit.training.rl",
    "collect_rollouts": "tapekit.training.rl",
    "rollout_rows": "tapekit.training.rl",
    "RLRunConfig": "tapekit.training.rl",
    "RLRunResult": "tapekit.training.rl",
    "RLSetup": "tapekit.training.rl",
    "RLStepRecord": "tapekit.training.rl",
    "train_rl": "tapekit.training.rl",
    "LocalPolicy": "tapekit.training.rl",
    "RemotePolicy": "tapekit.training.rl",
    "CurriculumConfig": "tapekit.training.rl",
    "GRPOConfig": "tapekit.training.rl",
    "RLConfig": "tapekit.training.rl",
    "RolloutConfig": "tapekit.training.rl",
    "group_advantages": "tapekit.training.rl",
    "grpo_step": "tapekit.training.rl",
    "make_rl_batch": "tapekit.training.rl",
    "SECSampler": "tapekit.training.curriculum",
    "SweepRow": "tapekit.training._sweep",
    "config_grid": "tapekit.training._sweep",
    "read_sweep": "tapekit.training._sweep",
    "run_sweep": "tapekit.training._sweep",
    "sample_configs": "tapekit.training._sweep",
}


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tapekit.training' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
