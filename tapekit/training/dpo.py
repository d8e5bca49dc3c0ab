"""Preference pairs from tapes, and DPO on them.

Two tapes with the same start (two attempts at one task) share a prefix and then diverge. The
first step where they differ lies in a node run of each; when both runs were sampled from the
**same prompt** (identical prompt token ids), that prompt is the DPO prompt and the two runs'
sampled output ids are the chosen (the attempt with the better score) and the rejected
completion. Every id comes from the stored LLM calls (:class:`~tapekit.llm.base.TokenTrace`),
so the pair is exactly what the model saw and sampled; nothing is re-tokenised. Where the tapes
first differ in an observation (the environment answered differently), or the two prompts
differ, or a call has no token ids, there is no valid pair and the reason is kept.

Training runs on TRL's ``DPOTrainer``. Its dataset preparation in this TRL version always
extracts a text prompt, appends an EOS and tokenises text, which would re-tokenise and change
the sampled ids, so :func:`train_dpo` replaces only that step with a check of the id columns;
TRL's preference collator, loss and reference-model handling are used unchanged.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tapekit.errors import TrainingError
from tapekit.training._data import load_dataset_source
from tapekit.training._hf import load_model_and_tokenizer, lora_config, training_arguments
from tapekit.training._progress import trainer_callbacks
from tapekit.training._result import train_and_report, write_result
from tapekit.training.callbacks import check_report_to
from tapekit.training.config import DPOConfig

CallLookup = Callable[[str], Any]


@dataclass(frozen=True)
class PreferencePair:
    """One DPO pair: the shared ``prompt_ids`` and the two sampled completions, with where
    they come from (tape ids, the agent and node of the diverging run, its step index on the
    tapes, the two scores)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    chosen_tape_id: str
    rejected_tape_id: str
    agent: str
    node: str
    step_index: int
    chosen_score: float
    rejected_score: float
    task_id: str = ""


@dataclass
class PairSet:
    """The pairs made from a set of tapes, and why the other candidate pairs were skipped."""

    pairs: list[PreferencePair] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def to_dataset(self) -> Any:
        """The pairs as a ``datasets.Dataset`` (columns: the fields of :class:`PreferencePair`)."""
        from datasets import Dataset

        if not self.pairs:
            raise TrainingError(
                "no preference pairs: " + ("; ".join(self.skipped[:5]) or "no candidate tapes")
            )
        return Dataset.from_list([asdict(p) for p in self.pairs])


def _lookup(calls: Any) -> CallLookup:
    from tapekit.store.base import TapeStore

    if isinstance(calls, TapeStore):
        return calls.get_llm_call
    if isinstance(calls, Mapping):
        return calls.get
    if callable(calls):
        return calls  # type: ignore[no-any-return]
    raise TypeError(
        "calls must be a tapekit store, a {prompt_id: LLMCall} mapping or a function of a prompt id"
    )


def diverging_pair(
    better: Any, worse: Any, calls: Any, scores: tuple[float, float] = (1.0, 0.0), task_id: str = ""
) -> PreferencePair | str:
    """The pair where tapes ``better`` and ``worse`` (same start) first diverge, or the reason
    there is none. ``calls`` finds each node run's LLM call by prompt id (a store, a mapping or
    a function)."""
    lookup = _lookup(calls)
    a, b = better.steps, worse.steps
    where = f"tapes {better.metadata.id} / {worse.metadata.id}"
    i = 0
    while i < min(len(a), len(b)) and a[i].llm_dict() == b[i].llm_dict():
        i += 1
    if i == len(a) == len(b):
        return f"{where}: identical steps, nothing to prefer"
    if i >= min(len(a), len(b)):
        return f"{where}: one tape is a prefix of the other (it stopped at step {i}), no sampled alternative"
    sa, sb = a[i].metadata, b[i].metadata
    if not (sa.agent and sa.prompt_id and sb.agent and sb.prompt_id):
        return (
            f"{where}: first differ at step {i}, which no agent made (the environment answered differently)"
        )
    if (sa.agent, sa.node) != (sb.agent, sb.node):
        return f"{where}: step {i} comes from different nodes ({sa.agent}.{sa.node} vs {sb.agent}.{sb.node})"
    call_a, call_b = lookup(sa.prompt_id), lookup(sb.prompt_id)
    for call, pid in ((call_a, sa.prompt_id), (call_b, sb.prompt_id)):
        if call is None:
            return f"{where}: no stored LLM call for prompt {pid} (step {i})"
        if call.tokens is None:
            return f"{where}: the LLM call of prompt {pid} has no token ids (use a backend that records them)"
    if call_a.tokens.prompt_ids != call_b.tokens.prompt_ids:
        return f"{where}: the runs at step {i} were sampled from different prompts"
    if call_a.tokens.output_ids == call_b.tokens.output_ids:
        return f"{where}: the runs at step {i} sampled the same tokens"
    start = i
    while start > 0 and a[start - 1].metadata.prompt_id == sa.prompt_id:
        start -= 1
    return PreferencePair(
        prompt_ids=list(call_a.tokens.prompt_ids),
        chosen_ids=list(call_a.tokens.output_ids),
        rejected_ids=list(call_b.tokens.output_ids),
        chosen_tape_id=better.metadata.id,
        rejected_tape_id=worse.metadata.id,
        agent=sa.agent,
        node=sa.node,
        step_index=start,
        chosen_score=scores[0],
        rejected_score=scores[1],
        task_id=task_id,
    )


def preference_pairs(
    report: Any,
    calls: Any = None,
    *,
    scorer: str | None = None,
    min_gap: float = 1e-9,
    pairs_per_task: int | None = 4,
    agent: str | None = None,
    node: str | None = None,
) -> PairSet:
    """Preference pairs from an :class:`~tapekit.evaluate.EvalReport` made in this process
    (its tapes grouped by task): within each task, every (better, worse) pair of attempts whose
    scores differ by more than ``min_gap`` (best gaps first, at most ``pairs_per_task``), cut
    where they diverge (:func:`diverging_pair`). The LLM calls (with their token ids) come from
    the report, else from ``calls`` (the store the evaluation wrote, a ``{prompt_id: LLMCall}``
    mapping or a function). ``agent``/``node`` keep only pairs from that agent/node.
    """
    if not getattr(report, "tapes", None):
        raise TrainingError(
            "the report holds no tapes (loaded from JSON?): evaluate, or rescore from the store"
        )
    name = report._scorer(scorer)
    fallback = _lookup(calls) if calls is not None else (lambda pid: None)
    known = report.llm_calls

    def lookup(pid: str) -> Any:
        call = known.get(pid)
        return call if call is not None and call.tokens is not None else (fallback(pid) or call)

    out = PairSet()
    for task_id, attempts in report.by_task().items():
        scored = [
            (s.scores[name].value, s) for s in attempts if name in s.scores and s.tape_id in report.tapes
        ]
        candidates = [(hi, lo) for (hi, lo) in itertools.permutations(scored, 2) if hi[0] - lo[0] > min_gap]
        candidates.sort(key=lambda pair: (-(pair[0][0] - pair[1][0]), pair[0][1].sample, pair[1][1].sample))
        made = 0
        for (score_hi, hi), (score_lo, lo) in candidates:
            if pairs_per_task is not None and made >= pairs_per_task:
                break
            pair = diverging_pair(
                report.tapes[hi.tape_id], report.tapes[lo.tape_id], lookup, (score_hi, score_lo), task_id
            )
            if isinstance(pair, str):
                out.skipped.append(f"task {task_id}: {pair}")
            elif (agent is None or pair.agent == agent) and (node is None or pair.node == node):
                out.pairs.append(pair)
                made += 1
    return out


def _checked_pairs(dataset: Any, config: DPOConfig) -> Any:
    needed = {"prompt_ids", "chosen_ids", "rejected_ids"}
    missing = needed - set(dataset.column_names)
    if missing:
        raise TrainingError(
            f"the DPO pairs lack columns {sorted(missing)} (they have {dataset.column_names}); "
            "make them with tapekit.training.dpo.preference_pairs(...).to_dataset()"
        )
    for i, row in enumerate(dataset.select_columns(sorted(needed))):
        for col in sorted(needed):
            if not row[col]:
                raise TrainingError(f"pair {i}: {col} is empty")
        longest = len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"]))
        if longest > config.max_length:
            raise TrainingError(f"pair {i} has {longest} tokens, more than max_length={config.max_length}")
    return dataset.select_columns(sorted(needed))


def build_dpo_trainer(
    dataset: Any,
    model: Any = None,
    tokenizer: Any = None,
    config: DPOConfig | None = None,
    callbacks: list[Any] | None = None,
) -> Any:
    """The TRL ``DPOTrainer`` that :func:`train_dpo` runs (token-id pairs in, nothing re-tokenised)."""
    from transformers import PrinterCallback
    from trl import DPOConfig as TRLDPOConfig
    from trl import DPOTrainer

    class _IdsDPOTrainer(DPOTrainer):  # type: ignore[misc]
        """DPOTrainer whose dataset preparation keeps the sampled token ids as they are."""

        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            return dataset

    config = config or DPOConfig()
    check_report_to(config.report_to)  # before any data or model is loaded
    pairs = _checked_pairs(load_dataset_source(dataset if dataset is not None else config.dataset), config)
    model, tokenizer = load_model_and_tokenizer(model, tokenizer, config)
    model.config.use_cache = False
    args = TRLDPOConfig(
        **training_arguments(config, len(pairs)),
        beta=config.beta,
        loss_type=[config.loss_type],
        max_length=config.max_length,
    )
    # full training needs a frozen reference; with LoRA, TRL uses the base model (adapter off)
    reference = copy.deepcopy(model).eval() if config.lora is None else None
    trainer = _IdsDPOTrainer(
        model=model,
        ref_model=reference,
        args=args,
        train_dataset=pairs,
        processing_class=tokenizer,
        peft_config=lora_config(config),
        callbacks=trainer_callbacks("dpo", callbacks),
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def train_dpo(
    dataset: Any = None,
    model: Any = None,
    *,
    tokenizer: Any = None,
    config: DPOConfig | None = None,
    callbacks: list[Any] | None = None,
) -> Path:
    """DPO on token-id pairs (``prompt_ids``, ``chosen_ids``, ``rejected_ids``: a dataset, rows
    or a file; :func:`preference_pairs` makes them from tapes) and return the result directory
    (``config.output_dir/final``: a LoRA adapter by default, else a full model), loadable with
    ``TransformersLLM`` like :func:`~tapekit.training.sft.train_sft`'s. With LoRA the
    reference model is the base model (adapter off); for full training, a frozen copy."""
    config = config or DPOConfig()
    trainer = build_dpo_trainer(dataset, model, tokenizer, config, callbacks)
    extra = train_and_report(trainer, config)
    return write_result(trainer, Path(config.output_dir) / "final", config, extra)
