"""What this machine's CPU can do fast, read once from the operating system (no torch).

Two choices depend on it:

- **bf16 on the CPU.** A bf16 matmul is fast only where the CPU has bf16 instructions
  (x86: ``avx512_bf16`` or AMX's ``amx_bf16``; Arm: the ``bf16`` feature). Elsewhere PyTorch
  emulates it: on a 2-core AVX2 EPYC a bf16 matmul ran at 0.8 GFLOPS against 43.9 in fp32, and
  forward+backward was 4.8x slower than fp32. :func:`native_bf16` says which case this is;
  training's ``dtype: auto`` picks bf16 on the CPU only when it is true.
- **Threads for local decoding.** :func:`usable_cpus` counts the CPUs this process may run on
  (its affinity mask, not the machine's total).

Only Linux's ``/proc/cpuinfo`` is read; on other systems :func:`native_bf16` answers ``False``
(fp32 is never the slow choice).
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``) from ``/proc/cpuinfo``; empty
    where that file does not exist or cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16() -> bool:
    """Whether the CPU has bf16 instructions (so bf16 compute is faster than fp32, not ~5x slower)."""
    return any(flag in cpu_flags() for flag in _BF16_FLAGS)


def native_bf16_reason() -> str:
    """A few words saying why :func:`native_bf16` answers as it does, for logs and warnings."""
    found = [flag for flag in _BF16_FLAGS if flag in cpu_flags()]
    if found:
        return f"this CPU has {', '.join(found)}"
    if not cpu_flags():
        return f"no CPU flags readable on {platform.system() or 'this system'}"
    return "this CPU has no bf16 instructions (no avx512_bf16, amx_bf16 or bf16 flag)"


def usable_cpus() -> int:
    """How many CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)
