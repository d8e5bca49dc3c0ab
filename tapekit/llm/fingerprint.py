"""Tokenizer fingerprints: one short string that says which tokenizer and chat template made a
list of token ids, the same for every backend that loads the same tokenizer.

The fingerprint hashes the text of every token id (what each id means) and the chat template
(how prompts are laid out). Two tokenizers with equal fingerprints map every id to the same
text, so ids recorded by one (llama.cpp running a GGUF file) can be trained with the other
(transformers loading the same file). Merge rules are not hashed: they only decide how new
text is split, which the training data's drift report checks by re-tokenising.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

_VERSION = "tk1"


def tokenizer_fingerprint(pieces: Sequence[str], chat_template: str | None) -> str:
    """The fingerprint of a vocabulary given as the text of each id (``pieces[i]`` is id
    ``i`` decoded on its own, special tokens as written, invalid UTF-8 replaced by U+FFFD)
    and of the chat template text (None or '' when there is none).

    Returns ``"tk1-<vocab size>-<16 hex digits>"``.
    """
    digest = hashlib.sha256()
    for piece in pieces:
        data = piece.encode("utf-8", errors="surrogatepass")
        digest.update(len(data).to_bytes(4, "little"))
        digest.update(data)
    template = (chat_template or "").encode()
    digest.update(b"\x00template\x00" + len(template).to_bytes(4, "little") + template)
    return f"{_VERSION}-{len(pieces)}-{digest.hexdigest()[:16]}"


def hf_tokenizer_fingerprint(tokenizer: Any) -> str:
    """The fingerprint of a Hugging Face tokenizer (vocabulary with added tokens, chat template)."""
    ids = [[i] for i in range(len(tokenizer))]
    pieces = tokenizer.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    template = getattr(tokenizer, "chat_template", None)
    return tokenizer_fingerprint(pieces, template if isinstance(template, str) else None)
