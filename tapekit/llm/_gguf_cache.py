"""A local cache of GGUF files converted to transformers checkpoints.

transformers reads a GGUF file by dequantizing every tensor and rebuilding the tokenizer from
the file's vocabulary in Python: about 20 s for the embedded SmolLM2-135M on 2 CPU cores, paid
on every load. :func:`cached_checkpoint` pays it once per file: the first load saves what it
built as a plain checkpoint (safetensors weights in float32, tokenizer, chat template, configs)
and every later load reads that instead (under a second). The weights, the tokenizer's ids and
the chat template are those of the GGUF load (tested).

Contract:

- **Key.** An entry belongs to one GGUF file as it is (resolved path, size, modification time)
  and one transformers version: a changed file or library gets a new entry; old entries stay
  until removed by hand (about 520 MB for the embedded model).
- **Whole or absent.** An entry is written to a temporary folder beside it and renamed into
  place; of processes racing to write the same entry one wins and the others use it.
- **Where.** ``$TAPEKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tapekit``, else
  ``~/.cache/tapekit``; entries under ``gguf/``.
- **Never in the way.** A cache that cannot be written costs only the saving: the load goes on
  from the GGUF file, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DONE = "tapekit-gguf-cache.json"
"""The file an entry is written with last: a folder without it is not an entry."""


def cache_root() -> Path:
    """The folder of tapekit's local caches (see the module docstring)."""
    explicit = os.environ.get("TAPEKIT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tapekit"


def entry_for(gguf: Path) -> Path:
    """Where the checkpoint of ``gguf`` (as the file is now) is or would be kept."""
    import transformers

    real = gguf.resolve()
    stat = real.stat()
    key = f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}\0{transformers.__version__}"
    return cache_root() / "gguf" / f"{real.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def cached_checkpoint(gguf: Path, convert: Callable[[], tuple[Any, Any]]) -> Path | None:
    """The folder of ``gguf``'s transformers checkpoint, made with ``convert`` (which loads the
    GGUF file: ``(model, tokenizer)``, float32, no quantization marks) when it is not cached
    yet; None when the cache cannot be written (the caller loads the GGUF file itself)."""
    entry = entry_for(gguf)
    if (entry / DONE).is_file():
        return entry
    try:  # before converting: an unwritable cache must not cost a conversion the caller repeats
        entry.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError as e:
        log.warning("tapekit: GGUF cache %s not writable (%s); loading %s without it", entry.parent, e, gguf)
        return None
    try:
        model, tokenizer = convert()  # its errors are the caller's (a missing or broken file)
        try:
            model.save_pretrained(scratch)
            tokenizer.save_pretrained(scratch)
            (scratch / DONE).write_text(json.dumps({"gguf": str(gguf.resolve())}) + "\n")
            try:
                scratch.rename(entry)
            except OSError:  # another process put the entry there first, or a half one is in the way
                if not (entry / DONE).is_file():
                    shutil.rmtree(entry, ignore_errors=True)
                    scratch.rename(entry)
        except OSError as e:
            log.warning(
                "tapekit: could not write the GGUF cache entry %s (%s); loading %s without it", entry, e, gguf
            )
            return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return entry
