"""Settings of the trainers (SFT, DPO), read from YAML or JSON files and command-line overrides.

One pydantic model per trainer, so a typo in a config file is an error that names the key, and
the same object drives the Python API (``train_sft(dataset, config=SFTConfig(...))``) and the
CLI (``tapekit train sft config.yaml --set learning_rate=1e-4``). Nothing heavy is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class LoraSettings(BaseModel):
    """LoRA adapter settings (peft): rank ``r``, scale ``alpha``, ``dropout`` and the modules
    to adapt (``"all-linear"``: every linear layer but the output head)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: str | list[str] = "all-linear"

    def peft_config(self, task_type: str = "CAUSAL_LM") -> Any:
        """These settings as a peft ``LoraConfig`` (imports peft): what the trainers give peft,
        and what a caller uses to put the same adapter on a model it then trains itself
        (``get_peft_model(model, settings.peft_config())``, then ``lora=None``)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            task_type=task_type,
        )


class TrainConfig(BaseModel):
    """What every trainer shares.

    - ``model``: a Hugging Face model directory (local; nothing is downloaded) or, from Python,
      ``train_*(..., model=<PreTrainedModel>, tokenizer=...)``. ``dataset``: a samples file
      (``.parquet``, ``.jsonl``) or a ``datasets`` directory (CLI; from Python pass the dataset).
    - ``output_dir``: checkpoints go to ``output_dir/checkpoint-N``, the result to
      ``output_dir/final`` (an adapter directory with ``lora``, else a full model directory).
    - ``lora``: LoRA settings, or ``None`` for full fine-tuning.
    - ``max_steps`` (> 0) wins over ``epochs``. ``batch_size`` counts packed rows (SFT) or pairs
      (DPO) per device per step before ``grad_accum``.
    - ``save_steps``: checkpoint every N steps (0: only the final model). ``resume``: ``True``
      resumes from the newest checkpoint in ``output_dir``, a path from that checkpoint.
    - ``device``: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``; ``dtype``:
      ``"auto"`` (bf16 on a GPU that has it and on a CPU with bf16 instructions, avx512_bf16 or
      AMX, else fp32; the run's log says which and why), ``"float32"``, ``"bfloat16"`` (on a CPU
      without bf16 instructions PyTorch emulates it, ~5x slower than fp32: a warning says so).
    - ``trace_data``: each process writes ``output_dir/trace-rank<R>.jsonl`` with a hash of
      every sample it trained on and, at the end, a hash of its weights (for checking data
      parallelism).
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    dataset: str | None = None
    output_dir: str = "tapekit-train"
    lora: LoraSettings | None = Field(default_factory=LoraSettings)
    learning_rate: float = Field(2e-4, gt=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int = -1
    batch_size: int = Field(1, gt=0)
    grad_accum: int = Field(1, gt=0)
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    lr_scheduler: str = "linear"
    max_grad_norm: float = 1.0
    seed: int = 0
    logging_steps: int = Field(10, gt=0)
    save_steps: int = Field(0, ge=0)
    save_total_limit: int | None = None
    resume: bool | str = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    gradient_checkpointing: bool = False
    trace_data: bool = False
    report_to: list[str] = Field(default_factory=list)


class SFTConfig(TrainConfig):
    """Supervised fine-tuning on token-exact samples (loss only where ``loss_mask`` is 1).

    - ``packing``: concatenate samples into rows of up to ``max_length`` tokens with no padding
      and no attention across samples (position ids restart at each sample); ``False`` pads
      each batch to its longest sample instead.
    - ``max_length``: tokens per packed row, and the longest sample allowed; a longer sample is
      an error unless ``too_long="drop"`` (dropped, counted in the log) or ``"truncate"``.
    - ``group_by_length`` (without packing): each batch is drawn from samples of similar
      length (transformers' length-grouped sampler), so less of it is padding.
    """

    packing: bool = True
    max_length: int = Field(2048, gt=0)
    too_long: Literal["error", "drop", "truncate"] = "error"
    group_by_length: bool = False

    @model_validator(mode="after")
    def _grouping_needs_padding(self) -> SFTConfig:
        if self.group_by_length and self.packing:
            raise ValueError("group_by_length groups padded batches: set packing=False to use it")
        return self


class DPOConfig(TrainConfig):
    """Direct preference optimisation on (prompt, chosen, rejected) token-id pairs.

    ``beta`` is the strength of the KL-like constraint to the reference model; ``loss_type``
    is TRL's (``"sigmoid"``: the DPO paper's). ``max_length`` bounds prompt + completion.
    With LoRA the reference model is the base model with the adapter switched off.
    """

    beta: float = Field(0.1, gt=0)
    loss_type: str = "sigmoid"
    max_length: int = Field(2048, gt=0)
    learning_rate: float = Field(5e-5, gt=0)


C = TypeVar("C", bound=TrainConfig)


def _parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, booleans, null, lists), else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["lora.r=8", "max_steps=20"]`` -> ``{"lora": {"r": 8}, "max_steps": 20}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} must look like key=value (e.g. max_steps=20)")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {part!r} was already set to a value")
        node[parts[-1]] = _parse_value(value)
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        bad = e.object[e.start]
        raise ValueError(f"config file {path}, line {line}: not valid UTF-8 (byte {bad:#04x})") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    elif path.suffix == ".json":
        data = json.loads(text)
    else:
        raise ValueError(f"config file {path}: use a .yaml, .yml or .json file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of settings, not {type(data).__name__}")
    return data


def load_config(cls: type[C], path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> C:
    """A config of class ``cls`` from a YAML/JSON file with ``overrides`` on top (either may be
    missing). Relative ``model``, ``dataset`` and ``output_dir`` paths in a file are taken
    relative to the file. Unknown keys and bad values are errors that name the key."""
    data: dict[str, Any] = {}
    where = "settings"
    if path is not None:
        file = Path(path)
        data = _read(file)
        where = str(file)
        for key in ("model", "dataset", "output_dir"):
            value = data.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                data[key] = str((file.parent / value).resolve())
    data = _merge(data, overrides or {})
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"bad {cls.__name__} in {where}: {problems}") from None
