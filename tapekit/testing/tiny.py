"""A tiny causal LM and its tokenizer, built locally in seconds: nothing is downloaded.

Training examples, tests and CI need a model that learns something real in a few CPU minutes.
:func:`make_tiny` trains a byte-level BPE tokenizer on your texts with the ``tokenizers``
library (digits split one per token, which arithmetic needs), wraps it as a transformers
``PreTrainedTokenizerFast`` with special tokens and a ChatML-style chat template whose
assistant turns are marked with ``{% generation %}`` (so token-exact samples can find the
assistant spans), and builds a randomly initialised Llama-architecture model sized by
:class:`TinyConfig`. The same texts, config and seed give the same tokenizer and weights.

``save_tiny`` / ``load_tiny`` write and read a plain Hugging Face model directory, which
``TransformersLLM(model_path=...)`` and the trainers load like any other model.

torch, transformers and tokenizers are imported inside the functions (extra ``train``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "END_OF_TURN",
    "PAD",
    "START_OF_TURN",
    "TinyConfig",
    "build_tiny_model",
    "load_tiny",
    "make_tiny",
    "save_tiny",
    "train_tokenizer",
]

START_OF_TURN = "<|im_start|>"
END_OF_TURN = "<|im_end|>"  # also the eos token: generation stops at the end of the assistant turn
PAD = "<|pad|>"
SPECIAL_TOKENS = [PAD, START_OF_TURN, END_OF_TURN]

# ChatML-style; the assistant's content and its end-of-turn token are inside {% generation %},
# so apply_chat_template(..., return_assistant_tokens_mask=True) marks exactly what the model writes.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- generation -%}{{ message['content'] }}{{ '<|im_end|>' }}{%- endgeneration -%}"
    "{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class TinyConfig:
    """The size of the tiny model and its tokenizer.

    ``vocab_size`` is the tokenizer's target (the 256 byte symbols and the special tokens
    included; a small corpus may give fewer). The model is a Llama-architecture decoder with
    tied input/output embeddings.

    Numbers are split one digit per token by default. ``whole_numbers=N`` makes each integer
    from 10 to N-1 one token instead (on top of ``vocab_size``): a model that copies numbers
    (from a question into a calculator call) learns that much faster from one token per number.
    """

    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 1024
    seed: int = 0
    whole_numbers: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TinyConfig.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"TinyConfig.hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_heads ({self.num_heads})"
            )
        if self.whole_numbers < 0:
            raise ValueError(f"TinyConfig.whole_numbers must be >= 0, got {self.whole_numbers}")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(
                f"TinyConfig.vocab_size must be at least {256 + len(SPECIAL_TOKENS)} "
                f"(256 byte symbols + special tokens), got {self.vocab_size}"
            )


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512, whole_numbers: int = 0) -> Any:
    """A byte-level BPE tokenizer trained on ``texts``, as a ``PreTrainedTokenizerFast``.

    Digits are split one per token before BPE, so numbers never merge into opaque chunks;
    with ``whole_numbers=N`` the integers 10..N-1 are single (ordinary, not special) tokens
    instead, matched longest first (``1234`` with N=1000 is ``123`` + ``4``).
    Every byte is in the alphabet, so any text encodes and decodes back unchanged. The
    tokenizer carries the special tokens (``<|im_start|>``, ``<|im_end|>`` = eos, ``<|pad|>``)
    and :data:`CHAT_TEMPLATE`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [t for t in texts if t]
    if not corpus:
        raise ValueError("train_tokenizer needs at least one non-empty text")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sorted(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=END_OF_TURN,
        pad_token=PAD,
        additional_special_tokens=[START_OF_TURN],
        clean_up_tokenization_spaces=False,
    )
    if whole_numbers > 10:
        fast.add_tokens([str(n) for n in range(10, whole_numbers)])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(tokenizer: Any, config: TinyConfig | None = None) -> Any:
    """A randomly initialised Llama-architecture causal LM for ``tokenizer`` (seeded by
    ``config.seed``, so the same config gives the same weights), in float32, in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = config or TinyConfig()
    eos = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    pad = tokenizer.convert_tokens_to_ids(PAD)
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    with torch.random.fork_rng(devices=[]):  # seed without disturbing the caller's RNG
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    return model.float().eval()


def make_tiny(texts: Iterable[str], config: TinyConfig | None = None, path: str | Path | None = None) -> Any:
    """Train a tokenizer on ``texts`` and build a tiny model for it: ``(model, tokenizer)``.

    With ``path``, both are also saved there (see :func:`save_tiny`). ``texts`` should cover
    what the model will read and write: prompts rendered with the chat template are ideal.
    """
    config = config or TinyConfig()
    tokenizer = train_tokenizer(texts, config.vocab_size, config.whole_numbers)
    model = build_tiny_model(tokenizer, config)
    if path is not None:
        save_tiny(model, tokenizer, path, config)
    return model, tokenizer


def save_tiny(model: Any, tokenizer: Any, path: str | Path, config: TinyConfig | None = None) -> Path:
    """Save the model and tokenizer as a Hugging Face model directory (and the
    :class:`TinyConfig`, when given, as ``tiny_config.json``); returns the directory."""
    import json

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if config is not None:
        (directory / "tiny_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    return directory


def load_tiny(path: str | Path) -> Any:
    """Load ``(model, tokenizer)`` saved by :func:`save_tiny` (float32, eval mode, local only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(path)
    if not (directory / "config.json").is_file() or not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{directory} is not a saved tiny model: it needs config.json and tokenizer.json "
            "(make one with tapekit.testing.tiny.make_tiny(texts, path=...))"
        )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    return model.eval(), tokenizer
