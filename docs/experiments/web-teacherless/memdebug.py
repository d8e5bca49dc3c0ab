"""``examples/web_agent/teacherless.py`` (same arguments) with one more step callback, which
appends to ``$MEMDEBUG_OUT`` after each RL step what the process holds: live torch tensors
(count, bytes), the object types whose counts grew most, and the resident size. It reads and
writes nothing the run uses, so the run is the command's own; the lr5e6 arm ran under it to find
where the resident size grew (``chain-lr5e6.sh``)."""

import gc
import json
import os
import sys
import time
from collections import Counter

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import contextlib

import examples.web_agent.teacherless as t
from tapekit.training import StepCallback

OUT = os.environ.get("MEMDEBUG_OUT", "/tmp/study/memdebug.jsonl")


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1e6
    return 0.0


class MemCB(StepCallback):
    def __init__(self) -> None:
        self.prev: Counter[str] = Counter()

    def on_step(self, record):  # type: ignore[no-untyped-def]
        try:
            self._scan(record)
        except Exception as e:  # a diagnostic never stops the run
            with open(OUT, "a") as f:
                f.write(json.dumps({"error": repr(e)}) + "\n")
        return None

    def _scan(self, record):  # type: ignore[no-untyped-def]
        import torch

        began = time.perf_counter()
        gc.collect()
        counts: Counter[str] = Counter()
        tensors = tbytes = 0
        for o in gc.get_objects():
            counts[f"{getattr(type(o), '__module__', '?')}.{getattr(type(o), '__qualname__', '?')}"] += 1
            if isinstance(o, torch.Tensor):
                tensors += 1
                with contextlib.suppress(Exception):
                    tbytes += int(o.untyped_storage().nbytes())
        grew = (counts - self.prev).most_common(12) if self.prev else []
        self.prev = counts
        line = {
            "step": record.metrics.get("step"),
            "rss_gb": round(rss_gb(), 2),
            "objects": sum(counts.values()),
            "tensors": tensors,
            "tensor_gb": round(float(tbytes) / 1e9, 3),
            "grew": grew,
            "scan_s": round(time.perf_counter() - began, 1),
        }
        with open(OUT, "a") as f:
            f.write(json.dumps(line) + "\n")
        return None


_orig = t.train_rl


def _patched(*a, callbacks=None, **k):
    return _orig(*a, callbacks=[*(callbacks or []), MemCB()], **k)


t.train_rl = _patched
t.main()
