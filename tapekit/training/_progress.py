"""What a run prints and which ``transformers`` callbacks it runs: one progress line per logging
step, and tapekit's step callbacks behind one ``TrainerCallback``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Literal

from tapekit.training.callbacks import hf_adapter, split_callbacks


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
    steps, others = split_callbacks(callbacks)
    return [progress_callback(), *([hf_adapter(trainer, steps)] if steps else []), *others]
