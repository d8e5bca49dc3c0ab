"""The end of an SFT or DPO run: train (resuming when asked), then save the model with
``tapekit_train.json`` (the config and the measured figures).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tapekit.training._hf import resume_argument
from tapekit.training.config import TrainConfig


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
