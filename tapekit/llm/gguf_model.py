"""A fully fine-tuned model as a GGUF file, so llama.cpp decodes with every tuned weight.

:func:`~tapekit.llm.gguf_lora.export_lora_gguf` covers students tuned with LoRA; a full
fine-tune (``lora=None``) changes every weight, embeddings and norms included, and needs a whole
model file. :func:`export_model_gguf` writes one from the base GGUF the model was loaded from:

- Everything that is not a weight (architecture, rope settings, the tokenizer and chat template)
  is copied from ``base_gguf`` unchanged, so llama.cpp tokenises and formats prompts exactly as
  for the base file (the token ids of a trace stay comparable).
- Every tensor of the base file is replaced by the model's weight of the same role (names mapped
  by ``gguf``'s tensor map; the q and k projections' rows reordered to GGUF's interleaved rotary
  layout, as for adapters). A base tensor the model has no weight for, or a model weight the base
  has no tensor for, is a :class:`ValueError`; nothing is written half-right. A tied output head
  stays tied (no ``output.weight`` when the base has none).
- ``quantization``: ``"q8_0"`` (default: ~8.5 bits per weight, near-lossless, and what llama.cpp
  decodes fastest on a CPU after Q4), ``"f16"``, ``"f32"``, or ``"base"`` (each tensor in the base
  file's own type, e.g. SmolLM2's Q4_1: smallest, but re-quantising to 4 bits can undo a small
  fine-tune). One-dimensional tensors (norms) stay f32 whatever is asked, as llama.cpp expects.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tapekit.llm.gguf_lora import _rotary_rows, read_gguf_base

Quantization = Literal["q8_0", "f16", "f32", "base"]
_SKIP_KEYS = ("GGUF.", "general.file_type")  # written by the writer itself / set below


def model_gguf_tensors(state: Mapping[str, Any], base_gguf: str | Path) -> dict[str, Any]:
    """GGUF tensor name -> float32 array for every tensor of the model at ``base_gguf``, taken
    from ``state`` (a Hugging Face state dict: ``model.layers.N.self_attn.q_proj.weight`` and the
    like, torch tensors or numpy arrays). Raises ``ValueError`` when the two do not correspond."""
    import gguf
    import numpy as np

    base = read_gguf_base(base_gguf)
    try:
        arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == base.arch)
    except StopIteration:
        raise ValueError(f"gguf does not know the architecture {base.arch!r}") from None
    names = gguf.get_tensor_name_map(arch, base.n_blocks)
    wanted = set(_layout(base_gguf).tensor_types)
    out: dict[str, Any] = {}
    for key, tensor in state.items():
        target = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"{key!r} has no tensor in a GGUF {base.arch} model")
        if target == "output.weight" and target not in wanted:
            continue  # a tied head: llama.cpp reuses token_embd.weight
        if target not in wanted:
            raise ValueError(f"{key!r} maps to {target}, which {base_gguf} does not have")
        array = tensor.detach().float().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
        array = np.ascontiguousarray(array, dtype=np.float32)
        kind = target.split(".")[2] if target.startswith("blk.") else ""
        if kind in ("attn_q", "attn_k"):
            array = _rotary_rows(array, base.n_head if kind == "attn_q" else base.n_head_kv)
        if target in out:
            raise ValueError(f"two model weights map to {target}")
        out[target] = array
    missing = sorted(wanted - set(out))
    if missing:
        raise ValueError(f"the model has no weight for {len(missing)} tensors of {base_gguf}: {missing[:4]}")
    return out


@dataclass(frozen=True)
class _Layout:
    """What an export copies from the base file: its metadata fields (name, value, type, array
    item type) and its tensors' names and types, in the file's order."""

    arch: str
    fields: tuple[tuple[str, Any, Any, Any], ...]
    tensor_types: dict[str, Any]


def _layout(path: str | Path) -> _Layout:
    """The base file's :class:`_Layout`. Parsing a GGUF file's metadata takes seconds (the
    tokenizer's 49k-entry arrays); an RL run exports every version from the same base, so the
    answer is kept per file and modification time."""
    resolved = Path(path).resolve()
    if not resolved.is_file():
        raise ValueError(f"no GGUF file at {path}")
    return _read_layout(str(resolved), resolved.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_layout(path: str, mtime_ns: int) -> _Layout:
    import gguf

    reader = gguf.GGUFReader(path)
    fields: list[tuple[str, Any, Any, Any]] = []
    for field in reader.fields.values():
        if field.name.startswith(_SKIP_KEYS) or field.name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        fields.append((field.name, field.contents(), field.types[0], sub_type))
    file_type = reader.get_field("general.file_type")
    if file_type is not None:
        fields.append(("general.file_type", file_type.contents(), None, None))
    arch = str(reader.get_field("general.architecture").contents())  # type: ignore[union-attr]
    return _Layout(arch, tuple(fields), {t.name: t.tensor_type for t in reader.tensors})


def _state_dict(model: Any) -> Mapping[str, Any]:
    if isinstance(model, (str, Path)):
        folder = Path(model)
        files = sorted(folder.glob("*.safetensors"))
        if not (folder / "config.json").is_file() or not files:
            raise ValueError(f"{folder} is not a saved model directory (config.json + *.safetensors)")
        from safetensors.numpy import load_file

        state: dict[str, Any] = {}
        for file in files:
            state.update(load_file(str(file)))
        return state
    if hasattr(model, "peft_config"):
        raise ValueError(
            "a PEFT model: export its adapter with export_lora_gguf, or merge it first "
            "(model.merge_and_unload()) to export a whole model"
        )
    return dict(model.state_dict())


def export_model_gguf(
    model: str | Path | Any,
    base_gguf: str | Path,
    out: str | Path,
    quantization: Quantization = "q8_0",
) -> Path:
    """Write a fully fine-tuned model as a GGUF model file for llama.cpp; returns ``out``.

    ``model``: a saved model directory (what ``train_sft(..., lora=None)`` writes to
    ``output_dir/final``) or a live ``PreTrainedModel``. ``base_gguf``: the GGUF file the model's
    starting weights came from (the embedded model: :func:`~tapekit.llm.llamacpp.smollm2_path`):
    its metadata and tokenizer are copied. Decode the result with ``LlamaCppLLM(model_path=out)``.
    Give each new export a new path: outputs cached by :class:`~tapekit.llm.cached.CachedLLM`
    are keyed by the model's settings.
    """
    import gguf
    import numpy as np

    if quantization not in ("q8_0", "f16", "f32", "base"):
        raise ValueError(f"quantization {quantization!r} is not q8_0, f16, f32 or base")
    base_path = Path(base_gguf)
    tensors = model_gguf_tensors(_state_dict(model), base_path)
    layout = _layout(base_path)
    base_types = layout.tensor_types
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), layout.arch)
    base_file_type = None
    for name, value, kind, sub_type in layout.fields:
        if name == "general.file_type":
            base_file_type = value
        else:
            writer.add_key_value(name, value, kind, sub_type)
    file_type = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "f32": gguf.LlamaFileType.ALL_F32}.get(quantization)  # fmt: skip
    if file_type is None:  # "base": the base file's own file type
        if base_file_type is None:
            raise ValueError(f"{base_gguf} has no general.file_type: export with q8_0, f16 or f32")
        file_type = gguf.LlamaFileType(int(base_file_type))
    writer.add_file_type(file_type)
    for name in base_types:  # the base file's order
        array = tensors[name]
        qtype = _tensor_type(quantization, base_types[name], array, gguf)
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16
            writer.add_tensor(name, array.astype(dtype))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)  # readers never see a half-written model
    return out


def _tensor_type(quantization: Quantization, base_type: Any, array: Any, gguf: Any) -> Any:
    """The GGML type one tensor is written in: norms and other 1-D tensors stay f32; a tensor
    whose rows do not split into the type's blocks falls back to f16."""
    q = gguf.GGMLQuantizationType
    if array.ndim < 2:
        return q.F32
    chosen = {"q8_0": q.Q8_0, "f16": q.F16, "f32": q.F32}.get(quantization, base_type)
    if chosen in (q.F32, q.F16):
        return chosen
    block, _ = gguf.GGML_QUANT_SIZES[chosen]
    return chosen if array.shape[-1] % block == 0 and math.prod(array.shape) else q.F16
