"""tapekit._heap: freed blocks over the threshold go back to the system on glibc.

Each case runs in a fresh interpreter (the allocator's settings are process-wide) that loads
the module from its file, so that nothing else imported first shapes the heap."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tapekit._heap import release_freed_memory

HEAP = Path(__file__).resolve().parents[1] / "tapekit" / "_heap.py"

# Frees 100 blocks of 2 MiB, each followed by a small live block, after one 8 MiB block was
# freed (which raises glibc's dynamic threshold above 2 MiB); prints the MiB given back.
_PATTERN = f"""
import gc, importlib.util, sys
spec = importlib.util.spec_from_file_location("heap", {str(HEAP)!r})
heap = importlib.util.module_from_spec(spec); spec.loader.exec_module(heap)
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
set_it = heap.release_freed_memory() if sys.argv[1] == "on" else None
big = bytearray(8 << 20); del big
blocks, pins = [], []
for _ in range(100):
    blocks.append(bytearray(2 << 20))
    pins.append(bytearray(4096))
before = rss()
del blocks; gc.collect()
print(set_it, (before - rss()) >> 20)
"""

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator only"
)


def _given_back(mode: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _PATTERN, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


@glibc
def test_freed_blocks_stay_resident_by_default_and_go_back_once_released() -> None:
    """The pattern of an RL process (a large block freed, then mid-sized ones among live small
    ones): glibc keeps the 200 MiB; with the threshold fixed at 1 MiB they are returned."""
    kept = _given_back("off")
    released = _given_back("on")
    assert kept[1] < 50, kept
    assert released == ("True", released[1]) and released[1] >= 190, released


@glibc
def test_the_environment_setting_wins() -> None:
    """``MALLOC_MMAP_THRESHOLD_`` set by the user: the call changes nothing and says so."""
    assert _given_back("on", MALLOC_MMAP_THRESHOLD_="4194304")[0] == "False"


def test_a_bad_threshold_is_refused() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive number of bytes"):
            release_freed_memory(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("switch", [True, False])
def test_train_rl_releases_on_the_cpu_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: bool
) -> None:
    """A CPU run fixes the threshold before its first step (``release_freed_memory`` on by
    default); ``release_freed_memory=False`` leaves the allocator alone."""
    import tapekit._heap
    from tapekit.training.rl import RLRunConfig, train_rl
    from tests.training.rl_toy import make_model, make_setup

    calls: list[int] = []
    monkeypatch.setattr(tapekit._heap, "release_freed_memory", lambda: calls.append(1) or True)
    assert RLRunConfig().release_freed_memory is True
    config = RLRunConfig(
        output_dir=str(tmp_path / "out"),
        steps=1,
        seed=1,
        rollouts={"tasks_per_step": 2, "group_size": 2, "max_tokens": 8, "max_loops": 1},
        release_freed_memory=switch,
    )
    model, tokenizer = make_model()
    train_rl(make_setup(), model, tokenizer, config)
    assert calls == ([1] if switch else [])
