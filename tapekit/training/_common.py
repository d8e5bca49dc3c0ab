"""Deprecated: what was here is split by concept (import from the new modules).

:mod:`tapekit.training._data` (samples sources, the packed-rows collator),
:mod:`tapekit.training._hf` (device, dtype, model loading, training arguments, LoRA),
:mod:`tapekit.training._trace` (sample and weight hashes), :mod:`tapekit.training._progress`
(progress line, transformers callbacks), :mod:`tapekit.training._result` (train, save the result);
``TrainingError`` is :class:`tapekit.errors.TrainingError`.
"""

# ruff: noqa: F401 - a deprecated shim: its imports are what it still offers

from __future__ import annotations

import warnings

from tapekit.errors import TrainingError
from tapekit.training._data import PackedRowsCollator, load_dataset_source, split_packed
from tapekit.training._hf import compute_dtype as _dtype
from tapekit.training._hf import device_of as _device
from tapekit.training._hf import (
    dtype_note,
    load_model_and_tokenizer,
    lora_config,
    resume_argument,
    training_arguments,
)
from tapekit.training._progress import progress_callback, trainer_callbacks
from tapekit.training._result import train_and_report, write_result
from tapekit.training._trace import Trace, sample_hash, weights_hash

warnings.warn(
    "tapekit.training._common is split by concept: import from tapekit.training._data, _hf, _trace, "
    "_progress or _result (TrainingError from tapekit.errors)",
    DeprecationWarning,
    stacklevel=2,
)
