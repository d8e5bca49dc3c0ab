"""Samples in, batches out: loading a samples source as a ``datasets.Dataset``, and the collator
of packed rows (with :func:`split_packed`, its inverse, which the data trace uses).

Heavy libraries (torch, datasets) are imported inside functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tapekit.errors import TrainingError
from tapekit.training._hf import need_train_extra


def load_dataset_source(source: Any) -> Any:
    """A ``datasets.Dataset`` from a Dataset, a list of row dicts, or a path: ``.parquet``,
    ``.jsonl``/``.json``, or a directory written by ``Dataset.save_to_disk``."""
    need_train_extra()
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
