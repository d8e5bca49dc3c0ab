"""The Hugging Face side of the trainers: the train extra's check, the device and compute dtype
of a run, loading the model and tokenizer, the ``TrainingArguments`` and the peft ``LoraConfig``
made from a :class:`~tapekit.training.config.TrainConfig`, and where a run resumes from.

Heavy libraries (torch, transformers, peft, trl, datasets) are imported inside functions.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from tapekit.errors import TrainingError
from tapekit.training.config import TrainConfig


def need_train_extra() -> None:
    try:
        import datasets  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"training needs the train extra: pip install 'tapekit[train]' (and torch) ({e})"
        ) from None


def device_of(config: TrainConfig) -> str:
    import torch

    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if config.device == "cuda" and not torch.cuda.is_available():
        raise TrainingError("device='cuda' but torch sees no CUDA device (set device: cpu or auto)")
    return config.device


def compute_dtype(config: TrainConfig, device: str) -> Any:
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
    device = device_of(config)
    chosen = str(compute_dtype(config, device)).removeprefix("torch.")
    if device == "cpu":
        from tapekit._cpu import native_bf16_reason

        why = f"dtype {config.dtype} on the CPU; {native_bf16_reason()}"
    else:
        why = f"dtype {config.dtype} on {device}"
    return f"compute dtype {chosen} ({why})"


def load_model_and_tokenizer(model: Any, tokenizer: Any, config: TrainConfig) -> tuple[Any, Any]:
    """The model and tokenizer to train: ``model`` is a loaded ``PreTrainedModel`` or a peft
    model whose adapter is trained as it is (``config.lora`` must then be ``None``; either way
    ``tokenizer`` is required), or a local model directory (``config.model`` when ``None``)."""
    need_train_extra()
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    source = model if model is not None else config.model
    if source is None:
        raise TrainingError(
            "no model: pass model= (a model directory or a loaded model) or set `model` in the config"
        )
    adapted = hasattr(source, "peft_config") and hasattr(source, "get_base_model")  # a peft model
    if isinstance(source, PreTrainedModel) or adapted:
        if tokenizer is None:
            raise TrainingError("a loaded model needs its tokenizer: pass tokenizer=")
        if adapted and config.lora is not None:
            raise TrainingError(
                "the model already carries a LoRA adapter (a peft model): set lora to None to "
                "train that adapter, or pass the base model to train a new one"
            )
        return source, tokenizer
    if not isinstance(source, (str, os.PathLike)):
        raise TrainingError(
            f"model must be a loaded transformers model, a peft model or a local model directory, "
            f"not {type(source).__name__}"
        )
    path = Path(source)
    if not (path / "config.json").is_file():
        raise TrainingError(
            f"model {source!r} is not a local model directory (no config.json there); "
            "tapekit never downloads models at training time"
        )
    device = device_of(config)
    loaded = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=compute_dtype(config, device)
    )
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path, local_files_only=True)
    return loaded, tok


def training_arguments(config: TrainConfig, n_rows: int) -> dict[str, Any]:
    """Keyword arguments of ``transformers.TrainingArguments`` (and TRL's configs) from
    ``config``; prints the run's :func:`dtype_note` (on the main process)."""
    device = device_of(config)
    dtype = compute_dtype(config, device)
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
    return None if config.lora is None else config.lora.peft_config(task_type)
