"""Supervised fine-tuning on token-exact samples, with LoRA or full weights, packed without padding.

The samples are rows of the training schema (``input_ids`` and a ``loss_mask`` that is 1 only on
tokens the model itself sampled): the labels are the ids where the mask is 1 and -100 elsewhere,
so prompts, tool results and other agents' text give no loss and no gradient.

Training runs on TRL's ``SFTTrainer``: the rows go in already tokenized with their ``labels``,
TRL packs them best-fit-decreasing into rows of ``max_length`` tokens and its padding-free
collator concatenates them with position ids that restart at 0 for each sample and no attention
mask. On GPUs with flash-attention the varlen kernels read the sample boundaries; with ``sdpa``
or ``eager`` attention (CPU), transformers' mask builder finds the same boundaries in the
position ids and builds a block-diagonal causal mask, **provided no KV cache is passed**
(``use_cache=False``, set on the model's config here; with a cache the detection is skipped
and samples would see each other). On CPU the loss is the model's own (see
:func:`_model_loss_trainer`), not TRL's chunked LM head. ``tests/training/test_train_sft.py`` checks
that the loss of a packed batch equals the token-weighted loss of the same samples run one by one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapekit.errors import TrainingError
from tapekit.training._data import PackedRowsCollator, load_dataset_source, split_packed
from tapekit.training._hf import device_of, load_model_and_tokenizer, lora_config, training_arguments
from tapekit.training._progress import trainer_callbacks
from tapekit.training._result import train_and_report, write_result
from tapekit.training._trace import Trace, sample_hash, weights_hash
from tapekit.training.callbacks import check_report_to
from tapekit.training.config import SFTConfig


def _check_row(i: int, row: dict[str, Any], config: SFTConfig) -> str | None:
    """Why row ``i`` cannot be trained on (``None`` when it can; ``"long"`` when too long)."""
    ids, mask = row.get("input_ids"), row.get("loss_mask")
    where = f"sample {i}" + (f" (tape {row['tape_id']})" if row.get("tape_id") else "")
    if not isinstance(ids, list) or not isinstance(mask, list):
        raise TrainingError(f"{where}: input_ids and loss_mask must be lists of ints")
    if len(ids) != len(mask):
        raise TrainingError(f"{where}: input_ids has {len(ids)} tokens but loss_mask has {len(mask)}")
    if any(m not in (0, 1) for m in mask):
        raise TrainingError(f"{where}: loss_mask must hold only 0 and 1")
    if not any(mask):
        raise TrainingError(f"{where}: loss_mask is all 0, so it has nothing to learn (filter it out first)")
    if len(ids) > config.max_length:
        if config.too_long == "error":
            raise TrainingError(
                f"{where} has {len(ids)} tokens, more than max_length={config.max_length} "
                "(raise max_length, or set too_long: drop | truncate)"
            )
        return "long"
    return None


def labelled(dataset: Any, config: SFTConfig | None = None) -> Any:
    """``dataset`` (training schema) as ``input_ids`` + ``labels`` rows, checked: equal lengths,
    a 0/1 mask with at least one 1, and the ``max_length`` policy applied."""
    from datasets import Dataset

    config = config or SFTConfig()
    missing = {"input_ids", "loss_mask"} - set(dataset.column_names)
    if missing:
        raise TrainingError(
            f"the samples lack columns {sorted(missing)} (they have {dataset.column_names}); "
            "make them with tapekit.training.samples"
        )
    rows: list[dict[str, list[int]]] = []
    dropped = 0
    for i, row in enumerate(
        dataset.select_columns(
            [c for c in ("input_ids", "loss_mask", "tape_id") if c in dataset.column_names]
        )
    ):
        verdict = _check_row(i, row, config)
        ids, mask = row["input_ids"], row["loss_mask"]
        if verdict == "long":
            if config.too_long == "drop":
                dropped += 1
                continue
            ids, mask = ids[: config.max_length], mask[: config.max_length]
            if not any(mask):
                dropped += 1
                continue
        rows.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask, strict=True)]})
    if not rows:
        raise TrainingError(
            f"no sample left to train on ({dropped} longer than max_length={config.max_length})"
        )
    out = Dataset.from_list(rows)
    out.info.description = f"dropped_too_long={dropped}"
    return out


def build_sft_trainer(
    dataset: Any,
    model: Any = None,
    tokenizer: Any = None,
    config: SFTConfig | None = None,
    callbacks: list[Any] | None = None,
) -> Any:
    """The TRL ``SFTTrainer`` that :func:`train_sft` runs, ready to ``.train()`` (for tests,
    benchmarks and custom loops)."""
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    config = config or SFTConfig()
    check_report_to(config.report_to)  # before any data or model is loaded
    data = labelled(load_dataset_source(dataset if dataset is not None else config.dataset), config)
    model, tokenizer = load_model_and_tokenizer(model, tokenizer, config)
    model.config.use_cache = False  # a KV cache would switch off the packed-sequence attention mask
    args = TRLSFTConfig(
        **training_arguments(config, len(data)),
        max_length=config.max_length,
        packing=config.packing,
        packing_strategy="bfd",
        padding_free=config.packing,
        completion_only_loss=False,
        assistant_only_loss=False,
        dataset_num_proc=None,
        shuffle_dataset=True,
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
    )
    trainer_class = _model_loss_trainer(SFTTrainer) if device_of(config) == "cpu" else SFTTrainer
    trainer_class = _traced_trainer(trainer_class) if config.trace_data else trainer_class
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=lora_config(config),
        callbacks=trainer_callbacks("sft", callbacks),
    )
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # the progress callback prints instead
    attention = str(getattr(model.config, "_attn_implementation", ""))
    if config.packing and not attention.startswith("flash"):
        # sdpa/eager: keep packed rows as rows (rows x L^2 attention, not (rows x L)^2); the
        # flash-attention kernels take TRL's single joined row with its sequence boundaries
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        trainer.data_collator = PackedRowsCollator(pad)
    return trainer


def _model_loss_trainer(base: type) -> type:
    """``base`` whose loss is the model's own causal-LM loss (``transformers.Trainer``'s path,
    the same token-weighted mean over the labelled tokens) instead of TRL's fused, chunked
    LM head.

    Measured on CPU (tiny 2-layer student, vocabulary 2,469, batches of 8 rows of ~110 tokens):
    TRL's chunked log-prob kernel took 60 % of each step (15.5 s of 26 s over 60 steps) where
    the model's forward pass took 3.9 s; the chunking saves memory on large vocabularies on a
    GPU and only costs time here. With the model's loss the same 60 steps took 17.1 s instead of
    28.3 s, with the same losses. TRL's token-accuracy and entropy metrics are not logged.

    On plain-head architectures (Llama, Mistral, Qwen) the LM head runs only on the positions
    that have a label (:func:`~tapekit.training._head_loss.labelled_loss`): the same loss and
    gradients; measured on the math example's tiny student (vocabulary 2,472, ~100-token samples,
    about a third of them trained) 9.9k instead of 5.5k tokens/s. The loss runs inside the
    accelerator's autocast (``dtype: bfloat16`` with fp32 weights: bf16 autocast on CPU), as the
    model's own forward would."""
    from transformers import Trainer

    from tapekit.training._head_loss import labelled_loss

    class ModelLoss(base):  # type: ignore[misc, valid-type]
        def compute_loss(
            self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            if not return_outputs and "labels" in inputs and self.label_smoother is None:
                items = num_items_in_batch if self.model_accepts_loss_kwargs else None
                # the decoder is called directly, around the forward accelerate wraps in its
                # autocast: enter it here, or dtype bfloat16 would train an fp32 model in fp32
                with self.accelerator.autocast():
                    loss = labelled_loss(model, inputs, items)
                if loss is not None:
                    if self.args.average_tokens_across_devices and items is not None:
                        loss = loss * self.accelerator.num_processes  # as Trainer.compute_loss does
                    return loss
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    return ModelLoss


def _traced_trainer(base: type) -> type:
    """``base`` whose every training step appends the hashes of its samples to the data trace."""

    class Traced(base):  # type: ignore[misc, valid-type]
        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            trace = getattr(self, "_tapekit_trace", None)
            if trace is None:
                trace = self._tapekit_trace = Trace(self.args.output_dir, self.args.process_index)
            samples = split_packed(
                inputs["input_ids"],
                inputs.get("position_ids"),
                inputs.get("attention_mask"),
                getattr(self.data_collator, "pad_token_id", None),
            )
            trace.write({"step": self.state.global_step, "samples": [sample_hash(s) for s in samples]})
            return super().training_step(model, inputs, num_items_in_batch)

    return Traced


def train_sft(
    dataset: Any = None,
    model: Any = None,
    *,
    tokenizer: Any = None,
    config: SFTConfig | None = None,
    callbacks: list[Any] | None = None,
) -> Path:
    """Fine-tune ``model`` on ``dataset`` and return the directory of the result.

    ``dataset``: samples in the training schema (a ``datasets.Dataset``, a list of rows, or a
    ``.parquet``/``.jsonl`` file; default ``config.dataset``). ``model``: a local model directory
    or a loaded model with its ``tokenizer`` (default ``config.model``); a peft model (one that
    already carries a LoRA adapter) trains that adapter, with ``config.lora`` set to ``None``. The result,
    ``config.output_dir/final``, is a LoRA adapter directory (``config.lora``, the default) or
    a full model directory, with the tokenizer and ``tapekit_train.json``; load it with
    ``TransformersLLM(model_path=<base>, adapter_path=<result>)`` (LoRA) or
    ``TransformersLLM(model_path=<result>)`` (full). ``config.resume`` continues from a
    checkpoint; run under ``accelerate launch`` for data parallelism.
    """
    config = config or SFTConfig()
    trainer = build_sft_trainer(dataset, model, tokenizer, config, callbacks)
    final = Path(config.output_dir) / "final"
    extra = train_and_report(trainer, config, lambda t: {"tokens_seen": t.state.num_input_tokens_seen})
    if config.trace_data:
        Trace(config.output_dir, trainer.args.process_index).write({"weights": weights_hash(trainer.model)})
    return write_result(trainer, final, config, extra)
