"""A PEFT LoRA adapter as a GGUF adapter file, so llama.cpp decodes with the tuned weights.

:class:`~tapekit.llm.llamacpp.LlamaCppLLM` (``lora_path=...``) applies such a file on top of its
base GGUF at run time: the base stays quantised and memory-mapped, the adapter is a few MB, and
converting after each RL update takes well under a second. That makes llama.cpp usable as the
rollout engine of a policy trained with LoRA through transformers.

The contract:

- The adapter must have been trained on the weights of ``base_gguf`` (for the embedded model:
  :class:`~tapekit.llm.transformers.TransformersLLM` loads the same file de-quantised). The
  architecture, block count and head counts are read from that file, not guessed.
- Only plain LoRA on the blocks' linear layers converts (attention q/k/v/o and the MLP's
  gate/up/down for llama-style models). Embedding or output-head adapters, DoRA, per-module
  ranks or alphas are refused with :class:`ValueError`, never written half-right.
- The scale is kept: llama.cpp multiplies ``B @ A`` by ``alpha / r``, PEFT by ``alpha / r``
  (``alpha / sqrt(r)`` with rsLoRA, which is written as an equivalent alpha).
- llama-style GGUF files store the rows of the q and k projections in an interleaved rotary
  order (Hugging Face's checkpoints keep the two halves of each head apart). ``B``'s rows are the
  projection's output rows, so they are reordered the same way; ``A`` is unchanged.

:func:`lora_gguf_tensors` is the pure part (names and arrays in, names and arrays out);
:func:`write_lora_gguf` and :func:`export_lora_gguf` read and write files.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<side>[AB])(?:\.[^.]+)?\.weight$")
_ROTARY = {"attn_q", "attn_k"}  # GGUF llama permutes these projections' output rows


class GGUFBase:
    """What the adapter needs to know of its base GGUF: architecture, blocks and heads."""

    def __init__(self, arch: str, n_blocks: int, n_head: int, n_head_kv: int) -> None:
        if n_blocks < 1 or n_head < 1 or n_head_kv < 1 or n_head % n_head_kv:
            raise ValueError(
                f"implausible base model: {n_blocks} blocks, {n_head} heads, {n_head_kv} kv heads"
            )
        self.arch, self.n_blocks, self.n_head, self.n_head_kv = arch, n_blocks, n_head, n_head_kv

    def __repr__(self) -> str:
        return f"GGUFBase({self.arch!r}, blocks={self.n_blocks}, heads={self.n_head}/{self.n_head_kv})"


def read_gguf_base(path: str | Path) -> GGUFBase:
    """The architecture and shape of the GGUF model at ``path`` (its metadata only; parsing it
    takes seconds for a 49k-token vocabulary, so the answer is kept per file and modification
    time)."""
    resolved = Path(path).resolve()
    if not resolved.is_file():
        raise ValueError(f"no GGUF file at {path}")
    return _read_base(str(resolved), resolved.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_base(path: str, mtime_ns: int) -> GGUFBase:
    import gguf

    reader = gguf.GGUFReader(str(path))

    def value(key: str) -> Any:
        field = reader.get_field(key)
        if field is None:
            raise ValueError(f"{path} has no {key!r}: not a GGUF model file this converter knows")
        return field.contents()

    arch = str(value("general.architecture"))
    n_head = int(value(f"{arch}.attention.head_count"))
    kv = reader.get_field(f"{arch}.attention.head_count_kv")
    return GGUFBase(arch, int(value(f"{arch}.block_count")), n_head, int(kv.contents()) if kv else n_head)


def _rotary_rows(weights: Any, n_head: int) -> Any:
    """Reorder output rows from Hugging Face's split-halves rotary layout to GGUF's interleaved
    one: within each head, row ``j`` of the first half and row ``j`` of the second half become
    neighbours (rows ``2j`` and ``2j + 1``)."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"{rows} output rows do not split into {n_head} rotary heads")
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def lora_gguf_tensors(state: Mapping[str, Any], base: GGUFBase) -> dict[str, Any]:
    """GGUF tensor name -> float32 array for every LoRA weight in ``state`` (a PEFT adapter's
    state dict: ``...layers.N.self_attn.q_proj.lora_A.weight`` and the like, torch tensors or
    numpy arrays). Raises ``ValueError`` for anything it cannot convert faithfully."""
    import gguf
    import numpy as np

    try:
        arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == base.arch)
    except StopIteration:
        raise ValueError(f"gguf does not know the architecture {base.arch!r}") from None
    names = gguf.get_tensor_name_map(arch, base.n_blocks)
    out: dict[str, Any] = {}
    for key, tensor in state.items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise ValueError(f"{key!r} is not a plain LoRA A/B weight (embedding adapters, DoRA and "
                             "trained base layers do not convert)")  # fmt: skip
        module, side = match["module"], match["side"]
        target = names.get_name(module)
        if target is None or not target.startswith("blk."):
            raise ValueError(f"LoRA on {module!r} has no block tensor in a GGUF {base.arch} model")
        array = tensor.detach().float().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
        array = np.ascontiguousarray(array, dtype=np.float32)
        kind = target.split(".")[2]
        if side == "B" and kind in _ROTARY:
            array = _rotary_rows(array, base.n_head if kind == "attn_q" else base.n_head_kv)
        name = f"{target}.weight.lora_{side.lower()}"
        if name in out:
            raise ValueError(f"two adapter weights map to {name}")
        out[name] = array
    pairs = {n.rsplit(".", 1)[0] for n in out}
    for stem in pairs:
        a, b = out.get(stem + ".lora_a"), out.get(stem + ".lora_b")
        if a is None or b is None:
            raise ValueError(f"{stem} has only one of LoRA's A and B")
        if a.shape[0] != b.shape[1]:
            raise ValueError(f"{stem}: A has rank {a.shape[0]}, B has rank {b.shape[1]}")
    if not out:
        raise ValueError("the adapter holds no LoRA weights")
    return out


def _alpha(config: Mapping[str, Any]) -> float:
    """The alpha that gives llama.cpp's ``alpha / r`` scale PEFT's scale for ``config``."""
    if config.get("use_dora"):
        raise ValueError("DoRA adapters do not convert (llama.cpp applies plain LoRA)")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("per-module ranks or alphas do not convert: one alpha per file")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha * math.sqrt(r) if config.get("use_rslora") else alpha


def write_lora_gguf(
    tensors: Mapping[str, Any], alpha: float, base: GGUFBase, out: str | Path, name: str = "tapekit-lora"
) -> Path:
    """Write ``tensors`` (from :func:`lora_gguf_tensors`) as a GGUF LoRA adapter file."""
    import gguf

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), base.arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    writer.add_name(name)
    for tensor_name in sorted(tensors):
        writer.add_tensor(tensor_name, tensors[tensor_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)  # readers never see a half-written adapter
    return out


def export_lora_gguf(
    adapter: str | Path | Any,
    base_gguf: str | Path | GGUFBase,
    out: str | Path,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Convert a PEFT LoRA adapter for llama.cpp; returns ``out``.

    ``adapter``: a saved adapter directory (``adapter_config.json`` and
    ``adapter_model.safetensors``, what ``train_sft(..., lora=...)`` writes), or a live PEFT
    model (its current adapter weights, e.g. after an RL update). ``base_gguf``: the GGUF file
    the adapter's base weights came from (the embedded model: :func:`~tapekit.llm.llamacpp.smollm2_path`),
    or its :func:`read_gguf_base`. ``config``: the live model's LoRA settings when they are not
    its ``peft_config["default"]``. Converting SmolLM2-135M's rank-16 adapter takes ~30 ms.
    """
    base = base_gguf if isinstance(base_gguf, GGUFBase) else read_gguf_base(base_gguf)
    if isinstance(adapter, (str, Path)):
        folder = Path(adapter)
        config_file, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
        if not config_file.is_file() or not weights.is_file():
            raise ValueError(
                f"{folder} is not a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)"
            )
        from safetensors.numpy import load_file

        settings = json.loads(config_file.read_text())
        state: Mapping[str, Any] = load_file(str(weights))
    else:
        from peft import get_peft_model_state_dict

        settings = config or adapter.peft_config["default"].to_dict()
        state = get_peft_model_state_dict(adapter)
    return write_lora_gguf(lora_gguf_tensors(state, base), _alpha(settings), base, out)
