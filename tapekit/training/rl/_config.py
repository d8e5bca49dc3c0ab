"""The settings of an RL run, each defined once, and the view of them that one GRPO step reads.

:class:`RLRunConfig` is a :class:`~tapekit.training.config.TrainConfig` (the model, the output
directory, LoRA, the optimiser's learning rate, weight decay and gradient clipping, the seed,
resuming, the device, the trackers) with what only RL has: the run's own fields (``setup``,
``steps``, ``mode``, ...) and three sections, :class:`GRPOConfig` (``grpo``: the update),
:class:`RolloutConfig` (``rollouts``: what each step samples, and where) and
:class:`CurriculumConfig` (``curriculum``: which tasks each step draws). A YAML file::

    model: student
    steps: 200
    grpo: {clip_low: 0.2, ppo_epochs: 2}
    rollouts: {tasks_per_step: 16, group_size: 8, temperature: 0.5}
    curriculum: {kind: sec, sec_temperature: 0.3}

A config in the old flat shape (``group_size: 8`` beside ``clip_low: 0.2``) still loads, to the
same settings, with one ``DeprecationWarning`` naming each key's new place (:data:`MOVED`);
an unknown key is an error naming it. :class:`RLConfig` is the per-step view: the ``grpo``
section's knobs with the values the loop fills in (the sampling temperature, the pad id, ...).
Nothing heavy is imported.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tapekit.training.config import TrainConfig
from tapekit.training.rl._loss import Aggregation

if TYPE_CHECKING:
    from tapekit.evaluate import Task
    from tapekit.training.curriculum import CategorySampler


class _StepKnobs(BaseModel):
    """The GRPO knobs that one :func:`~tapekit.training.rl.grpo_step` reads (the base of both
    the run's ``grpo`` section and the per-step :class:`RLConfig`)."""

    model_config = ConfigDict(extra="forbid")

    clip_low: float = 0.2
    clip_high: float | None = None
    kl_coef: float = Field(0.0, ge=0)
    aggregation: Aggregation = "token"
    scale_rewards: bool = True
    micro_batch_size: int | None = Field(None, gt=0)
    negative_scale: float = Field(1.0, ge=0, le=1)
    share_prefix: bool = True


class GRPOConfig(_StepKnobs):
    """How each RL step updates the policy (the ``grpo`` section of :class:`RLRunConfig`).

    - ``clip_low``/``clip_high``: the trust region of the ratio, ``[1 - clip_low, 1 + clip_high]``
      (``clip_high`` defaults to ``clip_low``); ``kl_coef`` > 0 adds a k3 KL to the starting
      policy (a frozen copy of it is kept).
    - ``aggregation``: ``"token"``, ``"sequence"`` (the original GRPO) or ``"constant"`` (Dr.
      GRPO's normaliser: sequences x ``rollouts.max_tokens``); ``scale_rewards=False`` is Dr.
      GRPO's advantage (not divided by the group's standard deviation).
    - ``micro_batch_size``: rows per forward and backward pass (one optimiser step either way).
    - ``negative_scale`` multiplies the negative advantages (1.0: plain GRPO; 0.0: only the
      rollouts better than their group's mean are reinforced, as rejection sampling does).
    - ``share_prefix``: a group's shared prompt runs through the model once per micro-batch.
    - ``group_key``: what a group is, the rollouts whose rewards are compared: ``"task_id"``
      (the ``group_size`` attempts of one task, GRPO's group) or ``"category"`` (every rollout
      of the step in one task category, several tasks' attempts: a baseline per kind of task,
      for when one task's attempts nearly always score alike, as a small model's attempts at
      one page do; the tasks' own difficulty then adds to the advantage's variance).
    - ``ppo_epochs`` x ``minibatches``: the optimiser steps made on each step's rollouts
      (minibatches of whole groups; from the second on, the ratio leaves 1 and clipping acts).
    """

    group_key: Literal["task_id", "category"] = "task_id"  # the rollout rows' grouping columns
    ppo_epochs: int = Field(1, gt=0)
    minibatches: int = Field(1, gt=0)


class RLConfig(_StepKnobs):
    """What one :func:`~tapekit.training.rl.grpo_step` reads: the ``grpo`` section's knobs
    (:class:`GRPOConfig` but its loop counts) and what the loop fills in for each step.

    ``temperature`` must be the sampling temperature (``rollouts.temperature`` in a run);
    ``max_tokens`` is Dr. GRPO's normaliser, needed by ``aggregation="constant"``;
    ``max_grad_norm`` <= 0 disables gradient clipping; ``group_key`` names the column grouping
    the G rollouts of one task; ``pad_id`` pads the batch (the tokenizer's). Immutable.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, gt=0)
    max_tokens: int | None = None
    max_grad_norm: float = 1.0
    group_key: str = "task_id"
    pad_id: int = 0

    @model_validator(mode="after")
    def _constant_needs_max_tokens(self) -> RLConfig:
        if self.aggregation == "constant" and not self.max_tokens:
            raise ValueError("RLConfig: aggregation='constant' needs max_tokens (Dr. GRPO's normaliser)")
        return self


class RolloutConfig(BaseModel):
    """What each RL step samples, and where (the ``rollouts`` section of :class:`RLRunConfig`).

    - ``tasks_per_step`` tasks, ``group_size`` sampled attempts of each (one GRPO group), at
      ``temperature`` with at most ``max_tokens`` per LLM call and ``max_loops`` agent turns.
    - ``share_prompts`` (the in-process engine): what a batch's prompts share (a group's
      identical first-turn prompts, the common system prompt) is prefilled once and its KV cache
      shared (:func:`~tapekit.llm.batched.shared_prompt_cache`).
    - ``resample_rounds`` > 0: dynamic sampling (as in DAPO): up to that many more rounds, each
      drawing as many new tasks as the step lacks groups whose rewards differ (one process only).
    - ``engine``: ``"transformers"`` (a batched ``generate`` in this process, the default) or
      ``"llamacpp"`` (llama.cpp in this process, ``threads`` decoding: a LoRA run's adapter
      converted to GGUF on the base file ``gguf``, None: the embedded SmolLM2; a full fine-tune
      written as a whole GGUF model in ``gguf_quantization``, ``"q8_0"`` by default, with the
      base file's tokenizer).
    - ``servers``: OpenAI-compatible (vLLM) servers serving ``served_model`` with dynamic LoRA:
      each version's adapter is saved to ``adapter_dir`` (default ``output_dir/adapters``) and
      loaded as ``<lora_name_prefix>-v<N>`` (default prefix: the run name); ``logprobs``:
      ``"processed"`` when the servers return the sampled distribution's log-probs
      (``--logprobs-mode processed_logprobs``), needed at a temperature other than 1.
    """

    model_config = ConfigDict(extra="forbid")

    tasks_per_step: int = Field(8, gt=0)
    group_size: int = Field(8, gt=1)
    temperature: float = Field(1.0, gt=0)
    max_tokens: int = Field(64, gt=0)
    max_loops: int | None = 8
    resample_rounds: int = Field(0, ge=0)
    share_prompts: bool = True
    engine: Literal["transformers", "llamacpp"] = "transformers"
    gguf: str | None = None
    gguf_quantization: Literal["q8_0", "f16", "f32"] = "q8_0"
    threads: int | None = None
    servers: list[str] = Field(default_factory=list)
    served_model: str | None = None
    adapter_dir: str | None = None
    lora_name_prefix: str | None = None
    logprobs: Literal["raw", "processed"] = "raw"


class CurriculumConfig(BaseModel):
    """Which tasks each RL step draws (the ``curriculum`` section of :class:`RLRunConfig`).

    ``kind``: ``"sec"`` (Self-Evolving Curriculum: a bandit over the categories, learning rate
    ``sec_alpha``, Boltzmann temperature ``sec_temperature``), ``"uniform"``, or ``"fixed"``
    (the categories in ``fixed_order``, default sorted, ``steps_per_category`` steps each).
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sec", "uniform", "fixed"] = "sec"
    sec_alpha: float = Field(0.5, gt=0, le=1)
    sec_temperature: float = Field(0.2, gt=0)
    fixed_order: list[str] | None = None
    steps_per_category: int = Field(5, gt=0)

    def sampler(
        self, tasks: Sequence[Task], *, seed: int = 0, log_fn: Callable[..., None] | None = None
    ) -> CategorySampler[Task]:
        """The task sampler of this curriculum over ``tasks``, seeded by ``seed``."""
        from tapekit.training.curriculum import FixedOrderSampler, SECSampler, UniformSampler

        if self.kind == "sec":
            return SECSampler(
                tasks, alpha=self.sec_alpha, temperature=self.sec_temperature, seed=seed, log_fn=log_fn
            )
        if self.kind == "fixed":
            order = self.fixed_order or sorted({t.category for t in tasks})
            return FixedOrderSampler(
                tasks, order, steps_per_category=self.steps_per_category, seed=seed, log_fn=log_fn
            )
        return UniformSampler(tasks, seed=seed, log_fn=log_fn)


MOVED: dict[str, tuple[str, str]] = {
    "clip_low": ("grpo", "clip_low"),
    "clip_high": ("grpo", "clip_high"),
    "kl_coef": ("grpo", "kl_coef"),
    "scale_rewards": ("grpo", "scale_rewards"),
    "aggregation": ("grpo", "aggregation"),
    "micro_batch_size": ("grpo", "micro_batch_size"),
    "negative_scale": ("grpo", "negative_scale"),
    "share_prefix": ("grpo", "share_prefix"),
    "ppo_epochs": ("grpo", "ppo_epochs"),
    "minibatches": ("grpo", "minibatches"),
    "tasks_per_step": ("rollouts", "tasks_per_step"),
    "group_size": ("rollouts", "group_size"),
    "temperature": ("rollouts", "temperature"),
    "max_tokens": ("rollouts", "max_tokens"),
    "max_loops": ("rollouts", "max_loops"),
    "resample_rounds": ("rollouts", "resample_rounds"),
    "rollout_engine": ("rollouts", "engine"),
    "rollout_gguf": ("rollouts", "gguf"),
    "rollout_threads": ("rollouts", "threads"),
    "rollout_servers": ("rollouts", "servers"),
    "served_model": ("rollouts", "served_model"),
    "adapter_dir": ("rollouts", "adapter_dir"),
    "lora_name_prefix": ("rollouts", "lora_name_prefix"),
    "rollout_logprobs": ("rollouts", "logprobs"),
    "curriculum": ("curriculum", "kind"),  # the old shape's curriculum was its kind ("sec")
    "sec_alpha": ("curriculum", "sec_alpha"),
    "sec_temperature": ("curriculum", "sec_temperature"),
    "fixed_order": ("curriculum", "fixed_order"),
    "steps_per_category": ("curriculum", "steps_per_category"),
}
"""Each key of the old flat :class:`RLRunConfig` that moved into a section: its new place."""

# Where RL's defaults differ from TrainConfig's (the fields are TrainConfig's): RL trains every
# weight unless told otherwise, on the CPU unless told otherwise, at a lower learning rate.
RL_DEFAULTS: dict[str, Any] = {
    "output_dir": "tapekit-rl",
    "lora": None,
    "learning_rate": 1e-4,
    "device": "cpu",
}

# TrainConfig's fields that RL has no use for (a value other than the default is an error)
UNUSED: dict[str, str] = {
    "dataset": "RL makes its data by rollouts (`setup`)",
    "epochs": "each step's rollouts get `grpo.ppo_epochs` passes",
    "max_steps": "RL runs `steps` RL steps (each `grpo.ppo_epochs` x `grpo.minibatches` optimiser steps)",
    "batch_size": "each step trains on `rollouts.tasks_per_step` x `rollouts.group_size` rollouts",
    "grad_accum": "`grpo.micro_batch_size` splits a step's passes",
    "warmup_ratio": "RL's learning rate is constant",
    "lr_scheduler": "RL's learning rate is constant",
    "logging_steps": "RL logs every step",
    "save_steps": "RL checkpoints after every step (`checkpoint`)",
    "save_total_limit": "RL keeps the newest checkpoint only",
    "dtype": "RL trains the model in the dtype it is given",
    "gradient_checkpointing": "RL does not checkpoint activations",
    "trace_data": "RL logs its rollouts to its store instead",
}


def _nest_old_keys(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each old flat key moved to its section (one warning for all of them); a
    key given both ways is an error naming both."""
    out = dict(data)
    moved = [k for k in MOVED if k in out and not (k == "curriculum" and not isinstance(out[k], str))]
    for old in moved:
        section, name = MOVED[old]
        value = out.pop(old)
        part = out.get(section) or {}
        part = part.model_dump(exclude_unset=True) if isinstance(part, BaseModel) else dict(part)
        if name in part:
            raise ValueError(f"RLRunConfig: {old} (the old flat shape) and {section}.{name} are both given")
        part[name] = value
        out[section] = part
    if moved:
        renames = ", ".join(f"{old} -> {'.'.join(MOVED[old])}" for old in moved)
        warnings.warn(
            f"RLRunConfig's flat keys are deprecated: they moved into sections ({renames})",
            DeprecationWarning,
            stacklevel=4,
        )
    return out


class RLRunConfig(TrainConfig):
    """Settings of an RL run (``tapekit train rl CONFIG`` reads them from YAML/JSON).

    The fields of :class:`~tapekit.training.config.TrainConfig` that RL uses are its own:
    ``model``, ``output_dir``, ``lora`` (None trains every weight), ``learning_rate``,
    ``weight_decay``, ``max_grad_norm`` (AdamW, clipped), ``seed``, ``resume`` (``True``: from the
    newest checkpoint in ``output_dir``), ``device``, ``report_to``. RL's defaults differ for
    four (:data:`RL_DEFAULTS`: ``output_dir="tapekit-rl"``, ``lora=None``, ``learning_rate=1e-4``,
    ``device="cpu"``); the others (``epochs``, ``batch_size``, ``dataset``, ...) mean nothing to
    RL, and setting one is an error that says what RL uses instead.

    RL's own: ``setup`` (CLI) names a ``module:attr`` callable returning an
    :class:`~tapekit.training.rl.RLSetup`, called with ``setup_args`` as keyword arguments (which
    tasks, which seeds: the run's data, in its config); ``run_name`` names the rollout tapes'
    tags; ``steps`` RL steps; ``mode`` ``"sync"`` or ``"async"`` (rollouts of the next steps on a
    copy of the policy, at most ``max_staleness`` versions behind); ``checkpoint`` after every
    step (atomic); ``journal`` (each step's token-exact training rows, sampler and RNG states
    and a digest of the weights in ``output_dir/journal/``, a few tens of kB a step: commit it,
    and a run whose checkpoints are lost is rebuilt by ``resume`` replaying the updates without
    any rollout, each checked against the digest; :mod:`tapekit.training.rl._journal`);
    ``release_freed_memory`` (on the CPU under glibc, tensors over 1 MiB go back
    to the system when freed, so the process's size stays flat from step to step: see
    :mod:`tapekit._heap`; false leaves the allocator alone); and the sections ``grpo``
    (:class:`GRPOConfig`), ``rollouts`` (:class:`RolloutConfig`) and ``curriculum``
    (:class:`CurriculumConfig`).
    """

    setup: str | None = None
    setup_args: dict[str, Any] = Field(default_factory=dict)
    run_name: str = "rl"
    steps: int = Field(20, gt=0)
    mode: Literal["sync", "async"] = "sync"
    max_staleness: int = Field(1, ge=0)
    checkpoint: bool = True
    journal: bool = False
    release_freed_memory: bool = True
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    rollouts: RolloutConfig = Field(default_factory=RolloutConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)

    @model_validator(mode="before")
    @classmethod
    def _old_shape_and_rl_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {**RL_DEFAULTS, **_nest_old_keys(data)}

    @model_validator(mode="after")
    def _only_what_rl_uses(self) -> RLRunConfig:
        for name, instead in UNUSED.items():
            if getattr(self, name) != TrainConfig.model_fields[name].get_default(call_default_factory=True):
                raise ValueError(f"RLRunConfig: {name} is not used by RL ({instead})")
        if isinstance(self.resume, str):
            raise ValueError(
                "RLRunConfig: resume is true or false (RL resumes from output_dir's newest checkpoint)"
            )
        if self.rollouts.resample_rounds and self.grpo.group_key != "task_id":
            raise ValueError(
                "RLRunConfig: rollouts.resample_rounds draws more tasks for tasks whose attempts all "
                f"scored alike, which needs grpo.group_key 'task_id' (not {self.grpo.group_key!r})"
            )
        return self

    def step_config(self, pad_id: int) -> RLConfig:
        """The :class:`RLConfig` of each GRPO step of this run (``pad_id``: the tokenizer's)."""
        knobs = self.grpo.model_dump(include=set(_StepKnobs.model_fields))
        return RLConfig(
            **knobs,
            temperature=self.rollouts.temperature,
            max_tokens=self.rollouts.max_tokens if self.grpo.aggregation == "constant" else None,
            max_grad_norm=self.max_grad_norm,
            group_key=self.grpo.group_key,
            pad_id=pad_id,
        )

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            """``config.group_size`` and the other old flat names still read (deprecated)."""
            if name in MOVED:
                section, field = MOVED[name]
                warnings.warn(
                    f"RLRunConfig.{name} is deprecated: read RLRunConfig.{section}.{field}",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(getattr(self, section), field)
            return super().__getattr__(name)


def make_sampler(
    config: RLRunConfig, tasks: Sequence[Task], log_fn: Callable[..., None] | None = None
) -> CategorySampler[Task]:
    """The task sampler of ``config.curriculum`` over ``tasks``, seeded by ``config.seed``."""
    return config.curriculum.sampler(tasks, seed=config.seed, log_fn=log_fn)
