"""Giving freed tensor memory back to the system on glibc (Linux) CPU runs.

PyTorch's CPU tensors come from the C heap (``malloc``). glibc serves a block from its own heap
unless it is larger than the *mmap threshold*, and that threshold is dynamic: each time a block
served by ``mmap`` is freed, the threshold rises to that block's size (up to 32 MiB). After the
first large activation is freed, later activations of a few MiB all come from the heap, and
when they are freed the heap keeps the pages (a live block above them pins the top). An RL
process alternates batched decoding and training passes of varying shapes, so the resident
size keeps climbing: a web-agent GRPO run (docs/experiments/web-teacherless.md) grew about 2 GB
per step and was killed for memory at 18.5 GB of 24 (``MALLOC_ARENA_MAX=2`` slowed it to
0.4–1.3 GB a step), with 2.2 GB of live tensors. With the threshold fixed at 1 MiB, blocks above
it are mapped and unmapped on their own, and the study's next run held 4.2–4.4 GB at the end of
every step.

:func:`release_freed_memory` fixes the threshold (glibc's ``mallopt(M_MMAP_THRESHOLD, n)``,
which also turns the dynamic rise off). It changes the whole process's allocator, so callers
apply it where the process is theirs (:func:`tapekit.training.train_rl` on the CPU, unless its
config's ``release_freed_memory`` is false). A threshold the user set in the environment
(``MALLOC_MMAP_THRESHOLD_``) is left as it is. Elsewhere (macOS, musl, Windows) nothing happens.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
DEFAULT_THRESHOLD = 1 << 20


def release_freed_memory(threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes so that freed blocks above it go back to
    the system; ``True`` if it was set, ``False`` where this is not glibc or the environment
    already sets ``MALLOC_MMAP_THRESHOLD_`` (the user's choice wins)."""
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold <= 0:
        raise ValueError(
            f"release_freed_memory: threshold must be a positive number of bytes, not {threshold!r}"
        )
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:  # the process's own symbols: glibc is linked in (no library search, no subprocess)
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, ctypes.c_int(threshold)))
    except (OSError, AttributeError):
        return False
