"""The compute dtype follows the CPU: bf16 only where the CPU has bf16 instructions (elsewhere
PyTorch emulates it, ~5x slower than fp32), chosen by ``dtype: auto``, said in the run's log,
and warned about when asked for explicitly on a CPU without them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import tapekit._cpu as cpu
from tapekit.training._hf import compute_dtype, dtype_note, training_arguments
from tapekit.training.config import SFTConfig

AVX2_ONLY = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f"})
WITH_BF16 = AVX2_ONLY | {"avx512_bf16"}


def _cpu(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)


def test_cpu_flags_are_read_from_proc_cpuinfo() -> None:
    flags = cpu.cpu_flags()
    if not Path("/proc/cpuinfo").is_file():
        assert flags == frozenset()
        return
    text = Path("/proc/cpuinfo").read_text()
    line = next(x for x in text.splitlines() if x.split(":")[0].strip() in ("flags", "Features"))
    assert flags == frozenset(line.split(":", 1)[1].split())
    assert cpu.native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert cpu.usable_cpus() >= 1


def test_auto_is_fp32_on_a_cpu_without_bf16_and_bf16_on_one_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SFTConfig(output_dir="unused", device="cpu", dtype="auto")
    _cpu(monkeypatch, AVX2_ONLY)
    assert compute_dtype(config, "cpu") == torch.float32
    assert "compute dtype float32" in dtype_note(config) and "no bf16 instructions" in dtype_note(config)
    _cpu(monkeypatch, WITH_BF16)
    assert compute_dtype(config, "cpu") == torch.bfloat16
    assert "compute dtype bfloat16" in dtype_note(config) and "avx512_bf16" in dtype_note(config)
    assert compute_dtype(SFTConfig(output_dir="unused", dtype="float32"), "cpu") == torch.float32


def test_explicit_bf16_on_a_cpu_without_it_is_kept_and_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SFTConfig(output_dir="unused", device="cpu", dtype="bfloat16")
    _cpu(monkeypatch, AVX2_ONLY)
    with pytest.warns(UserWarning, match="emulates bf16"):
        assert compute_dtype(config, "cpu") == torch.bfloat16
    _cpu(monkeypatch, WITH_BF16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compute_dtype(config, "cpu") == torch.bfloat16  # native: no warning


def test_the_run_prints_its_dtype_choice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cpu(monkeypatch, AVX2_ONLY)
    args = training_arguments(SFTConfig(output_dir="unused", device="cpu", max_steps=1), n_rows=1)
    assert args["bf16"] is False
    assert "compute dtype float32 (dtype auto on the CPU; this CPU has no bf16" in capsys.readouterr().out
