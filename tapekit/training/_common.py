"""What the SFT and DPO trainers share: loading samples, models and tokenizers; the Hugging Face
training arguments made from a :class:`~tapekit.training.config.TrainConfig`; progress output
(loss, tokens/s); the data trace that the data-parallel test reads; saving the result.

Heavy libraries (torch, transformers, datasets, peft, trl) are imported inside functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from tapekit.errors import TapekitError
from tapekit.training.config import TrainConfig

__all__ = [
    "PackedRowsCollator",
    "TrainingError",
    "load_dataset_source",
    "load_model_and_tokenizer",
    "progress_callback",
    "sample_hash",
    "training_arguments",
    "write_result",
]


class TrainingError(TapekitError, ValueError):
    """Bad training input (samples, model, config); the message says what and where."""


def _need_train_extra() -> None:
    try:
        import datasets  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"training needs the train extra: pip install 'tapekit[train]' (and torch) ({e})"
        ) from None


def load_dataset_source(source: Any) -> Any:
    """A ``datasets.Dataset`` from a Dataset, a list of row dicts, or a path: ``.parquet``,
    ``.jsonl``/``.json``, or a directory written by ``Dataset.save_to_disk``."""
    _need_train_extra()
    from datasets import Dataset, load_from_disk

    if isinstance(source, Dataset):
        return source
    if isinstance(source, list):
        if not source:
            raise TrainingError("the training set is empty (an empty list of samples)")
        return Dataset.from_list(source)
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if path.is_dir():
            return load_from_disk(str(path))
        if not path.is_file():
            raise TrainingError(f"samples file {path} does not exist")
        if path.suffix == ".parquet":
            return Dataset.from_parquet(str(path))
        if path.suffix in (".jsonl", ".json"):
            return Dataset.from_json(str(path))
        raise TrainingError(f"samples file {path}: use .parquet, .jsonl or a saved datasets directory")
    raise TrainingError(
        f"samples must be a datasets.Dataset, a list of dicts or a path, not {type(source).__name__}"
    )


def _device(config: TrainConfig) -> str:
    import torch

    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if config.device == "cuda" and not torch.cuda.is_available():
        raise TrainingError("device='cuda' but torch sees no CUDA device (set device: cpu or auto)")
    return config.device


def _dtype(config: TrainConfig, device: str) -> Any:
    """The compute dtype: ``auto`` is bf16 on a GPU that has it and on a CPU with bf16
    instructions (:func:`tapekit._cpu.native_bf16`), else fp32. An explicit ``bfloat16`` on a CPU
    without them is kept but warned about: PyTorch emulates bf16 there, several times slower."""
    import torch

    from tapekit._cpu import native_bf16, native_bf16_reason

    if config.dtype == "auto":
        if device == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if native_bf16() else torch.float32
    if config.dtype == "bfloat16" and device == "cpu" and not native_bf16():
        warnings.warn(
            f"dtype bfloat16 on the CPU, but {native_bf16_reason()}: PyTorch emulates bf16 here, "
            "several times slower than float32 (4.8x measured on an AVX2 EPYC); use dtype auto or float32",
            stacklevel=3,
        )
    return getattr(torch, config.dtype)


def dtype_note(config: TrainConfig) -> str:
    """One line for a run's log saying which compute dtype it trains in and why."""
    device = _device(config)
    chosen = str(_dtype(config, device)).removeprefix("torch.")
    if device == "cpu":
        from tapekit._cpu import native_bf16_reason

        why = f"dtype {config.dtype} on the CPU; {native_bf16_reason()}"
    else:
        why = f"dtype {config.dtype} on {device}"
    return f"compute dtype {chosen} ({why})"


def load_model_and_tokenizer(model: Any, tokenizer: Any, config: TrainConfig) -> tuple[Any, Any]:
    """The model and tokenizer to train: ``model`` is a loaded ``PreTrainedModel`` (then
    ``tokenizer`` is required) or a local model directory (``config.model`` when ``None``)."""
    _need_train_extra()
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    source = model if model is not None else config.model
    if source is None:
        raise TrainingError(
            "no model: pass model= (a model directory or a loaded model) or set `model` in the config"
        )
    if isinstance(source, PreTrainedModel):
        if tokenizer is None:
            raise TrainingError("a loaded model needs its tokenizer: pass tokenizer=")
        return source, tokenizer
    path = Path(str(source))
    if not (path / "config.json").is_file():
        raise TrainingError(
            f"model {source!r} is not a local model directory (no config.json there); "
            "tapekit never downloads models at training time"
        )
    device = _device(config)
    loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=_dtype(config, device))
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path, local_files_only=True)
    return loaded, tok


def training_arguments(config: TrainConfig, n_rows: int) -> dict[str, Any]:
    """Keyword arguments of ``transformers.TrainingArguments`` (and TRL's configs) from
    ``config``; prints the run's :func:`dtype_note` (on the main process)."""
    device = _device(config)
    dtype = _dtype(config, device)
    import torch

    if config.max_steps <= 0 and n_rows == 0:
        raise TrainingError("nothing to train on: the training set has no rows")
    if int(os.environ.get("RANK", "0")) == 0:  # the run's log says which dtype it chose and why
        print(dtype_note(config), file=sys.stdout, flush=True)
    args: dict[str, Any] = {
        "output_dir": config.output_dir,
        "learning_rate": config.learning_rate,
        "num_train_epochs": config.epochs,
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        "warmup_steps": config.warmup_ratio,
        "weight_decay": config.weight_decay,
        "lr_scheduler_type": config.lr_scheduler,
        "max_grad_norm": config.max_grad_norm,
        "seed": config.seed,
        "data_seed": config.seed,
        "logging_steps": config.logging_steps,
        "save_strategy": "steps" if config.save_steps else "no",
        "save_steps": config.save_steps or 500,
        "save_total_limit": config.save_total_limit,
        "use_cpu": device == "cpu",
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "report_to": config.report_to or "none",
        "disable_tqdm": True,
        "include_num_input_tokens_seen": "all",
        "dataloader_num_workers": 0,
        "ddp_backend": "gloo" if device == "cpu" and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    }
    # TRL's configs default to gradient checkpointing on: slower, and only worth it for memory
    args["gradient_checkpointing"] = config.gradient_checkpointing
    return args


def resume_argument(config: TrainConfig) -> str | bool | None:
    """What ``Trainer.train(resume_from_checkpoint=...)`` gets, checked: the newest checkpoint
    of ``output_dir`` for ``resume=True`` (an error when there is none), or the given path."""
    if config.resume is False:
        return None
    if config.resume is True:
        found = sorted(Path(config.output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        if not found:
            raise TrainingError(
                f"resume=True but {config.output_dir} has no checkpoint-* directory to resume from"
            )
        return str(found[-1])
    if not Path(config.resume).is_dir():
        raise TrainingError(f"resume={config.resume!r} is not a checkpoint directory")
    return config.resume


def lora_config(config: TrainConfig, task_type: str = "CAUSAL_LM") -> Any:
    """The peft ``LoraConfig`` for ``config.lora`` (``None`` for full fine-tuning)."""
    if config.lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        task_type=task_type,
    )


def sample_hash(ids: Sequence[int]) -> str:
    """A short content hash of one sample's token ids (what the data trace records)."""
    return hashlib.sha256(json.dumps(list(map(int, ids))).encode()).hexdigest()[:16]


def weights_hash(model: Any) -> str:
    """A hash of every trainable parameter's values (equal across data-parallel ranks)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().round(6).tobytes())
    return digest.hexdigest()[:16]


class Trace:
    """Appends JSON lines to ``output_dir/trace-rank<R>.jsonl`` (one file per process)."""

    def __init__(self, output_dir: str, rank: int) -> None:
        self.path = Path(output_dir) / f"trace-rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        """Add one record."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def split_packed(
    values: Any, position_ids: Any | None, attention_mask: Any | None, pad_value: int | None = None
) -> Iterable[list[int]]:
    """The samples in a collated batch (of ``values``: input ids or labels): packed rows split
    where the position ids restart, without the padding at a row's end (the tail of
    ``pad_value`` tokens at position 0; without ``pad_value``, a tail of two or more position
    ids 0), padded rows cut to their attention mask."""
    for row in range(values.shape[0]):
        items = values[row].tolist()
        if position_ids is None:
            n = int(attention_mask[row].sum()) if attention_mask is not None else len(items)
            yield items[:n]
            continue
        pos = position_ids[row].tolist()
        if pad_value is not None:
            end = len(items)
            while end > 0 and pos[end - 1] == 0 and items[end - 1] == pad_value:
                end -= 1
        else:
            end = len(pos)
            while end > 1 and pos[end - 1] == 0 and pos[end - 2] == 0:
                end -= 1
        starts = [i for i in range(end) if pos[i] == 0]
        for s, e in zip(starts, [*starts[1:], end], strict=True):
            yield items[s:e]


class PackedRowsCollator:
    """Collates BFD-packed rows (``input_ids``, ``labels``, ``seq_lengths``) into a
    ``[rows, longest row]`` batch with no attention mask: position ids restart at 0 for each
    sample, so the model's mask builder gives each sample a causal block of its own (the
    varlen kernels of flash-attention read the same boundaries). Unlike TRL's padding-free
    collator, which joins the whole batch into one row, the rows stay rows: with ``sdpa`` or
    ``eager`` attention (CPU, or a GPU without flash-attention) the masked attention costs
    rows x L^2 rather than (rows x L)^2. The short tail that pads a row to the longest has
    position ids 0 (each pad token its own block) and labels -100."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        """Stack the rows (each sample's first label is -100: nothing precedes it to predict from)."""
        import torch

        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(examples), width), -100, dtype=torch.long)
        positions = torch.zeros((len(examples), width), dtype=torch.long)
        for row, example in enumerate(examples):
            n = len(example["input_ids"])
            ids[row, :n] = torch.tensor(example["input_ids"])
            labels[row, :n] = torch.tensor(example["labels"])
            lengths = example.get("seq_lengths") or [n]
            positions[row, :n] = torch.cat([torch.arange(length) for length in lengths])
            labels[row, :n][positions[row, :n] == 0] = -100
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


def progress_callback(total_label: str = "") -> Any:
    """A ``TrainerCallback`` that prints one line per logging step on the main process:
    step, loss, learning rate and tokens/s (every input token, all processes together)."""
    from transformers import TrainerCallback

    class _Progress(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.t0 = time.perf_counter()
            self.tokens0 = 0
            self.last: dict[str, float] = {}

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = time.perf_counter()
            self.tokens0 = state.num_input_tokens_seen

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not state.is_world_process_zero or not logs:
                return
            elapsed = max(time.perf_counter() - self.t0, 1e-9)
            tps = (state.num_input_tokens_seen - self.tokens0) / elapsed
            self.last = {"tokens_per_s": tps, "elapsed_s": elapsed}
            parts = [f"step {state.global_step}/{state.max_steps}"]
            for key in ("loss", "rewards/margins", "rewards/accuracies", "learning_rate"):
                if key in logs:
                    parts.append(f"{key.replace('rewards/', '')} {logs[key]:.4g}")
            if "train_loss" in logs:
                parts.append(f"train_loss {logs['train_loss']:.4f}")
            parts.append(f"tokens/s {tps:,.0f}")
            print(f"{total_label}" + "  ".join(parts), file=sys.stdout, flush=True)

    return _Progress()


def trainer_callbacks(trainer: Literal["sft", "dpo"], callbacks: list[Any] | None) -> list[Any]:
    """The ``transformers`` callbacks of a run: the progress printer, the tapekit step callbacks
    among ``callbacks`` behind one :func:`~tapekit.training.callbacks.hf_adapter`, then the
    other (``transformers``) callbacks as given."""
    from tapekit.training.callbacks import hf_adapter, split_callbacks

    steps, others = split_callbacks(callbacks)
    return [progress_callback(), *([hf_adapter(trainer, steps)] if steps else []), *others]


def write_result(trainer: Any, final_dir: Path, config: TrainConfig, extra: dict[str, Any]) -> Path:
    """Save the trained model (the adapter with LoRA) and tokenizer to ``final_dir`` on the main
    process, with ``tapekit_train.json`` (config and figures); returns ``final_dir``."""
    trainer.save_model(str(final_dir))
    if trainer.is_world_process_zero():
        info = {"config": config.model_dump(mode="json"), **extra}
        (final_dir / "tapekit_train.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return final_dir


def train_and_report(
    trainer: Any, config: TrainConfig, more: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Train (resuming from a checkpoint when ``config`` asks) and return the figures that
    ``tapekit_train.json`` records: base model, LoRA or not, steps, training loss, ``more(trainer)``
    why a step callback stopped the run (``stopped``, ``None`` when none did), ``more(trainer)``
    and the last progress line's figures (which win on a shared key)."""
    result = trainer.train(resume_from_checkpoint=resume_argument(config))
    figures: dict[str, float] = next(
        (c.last for c in trainer.callback_handler.callbacks if getattr(c, "last", None)), {}
    )
    stopped = next(
        (c.stopped for c in trainer.callback_handler.callbacks if getattr(c, "stopped", None)), None
    )
    return {
        "stopped": stopped,
        "base_model": str(config.model or getattr(trainer.model.config, "_name_or_path", "")),
        "lora": config.lora is not None,
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        **(more(trainer) if more is not None else {}),
        **figures,
    }
