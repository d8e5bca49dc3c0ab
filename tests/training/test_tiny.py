"""The tiny model builder: a locally trained tokenizer with a marked chat template, a seeded
Llama-architecture model, saved and loaded as a plain model directory, and able to learn."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

HAVE_TRAIN = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers"))
pytestmark = pytest.mark.skipif(
    not HAVE_TRAIN,
    reason="needs torch, transformers and tokenizers (extra `train`; scripts/install-local.sh)",
)

TEXTS = [
    f"Ann has {a} pens and buys {b} more. How many pens does she have? calculator: {a}+{b} = {a + b}"
    for a in range(3, 60, 7)
    for b in range(2, 40, 9)
]
SMALL: dict[str, int] = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128}
MESSAGES = [
    {"role": "system", "content": "Solve the problem."},
    {"role": "user", "content": "Ann has 12 pens and buys 30 more."},
    {"role": "assistant", "content": "calculator: 12+30"},
    {"role": "user", "content": "[tool result] 42"},
    {"role": "assistant", "content": "Answer: 42"},
]


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from tapekit.testing.tiny import TinyConfig, make_tiny

    return make_tiny(TEXTS, TinyConfig(**SMALL))


def _weights_equal(a: Any, b: Any) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tokenizer_round_trips_any_text_and_splits_digits(tiny: tuple[Any, Any]) -> None:
    _, tok = tiny
    for text in ["Ann has 12 pens.", "ünïcödé ✓ and tabs\tand\nnewlines", "  leading spaces", "x" * 50]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    tokens = tok.convert_ids_to_tokens(tok("12345+678", add_special_tokens=False)["input_ids"])
    assert tokens == ["1", "2", "3", "4", "5", "+", "6", "7", "8"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok.eos_token_id != tok.pad_token_id
    assert len(tok) <= 512


def test_whole_numbers_are_single_tokens_and_still_round_trip() -> None:
    from tapekit.testing.tiny import TinyConfig, train_tokenizer

    tok = train_tokenizer(TEXTS, 512, whole_numbers=TinyConfig(whole_numbers=1000).whole_numbers)
    text = "calculator: 12+730 and 1234"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tokens = tok.convert_ids_to_tokens(ids)
    assert "12" in tokens and "730" in tokens and "123" in tokens and "4" in tokens
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text  # numbers are not special tokens


def test_chat_template_marks_exactly_the_assistant_turns(tiny: tuple[Any, Any]) -> None:
    _, tok = tiny
    out = tok.apply_chat_template(
        MESSAGES, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    marked = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert marked == "calculator: 12+30<|im_end|>Answer: 42<|im_end|>"
    text = tok.apply_chat_template(MESSAGES[:4], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\n[tool result] 42<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_same_texts_and_seed_give_the_same_tokenizer_and_weights(tiny: tuple[Any, Any]) -> None:
    from tapekit.testing.tiny import TinyConfig, make_tiny

    model, tok = tiny
    config = TinyConfig(**SMALL)
    model2, tok2 = make_tiny(list(reversed(TEXTS)), config)
    assert tok2.get_vocab() == tok.get_vocab()
    assert _weights_equal(model, model2)
    model3, _ = make_tiny(TEXTS, TinyConfig(**SMALL, seed=1))
    assert not _weights_equal(model, model3)


def test_save_and_load_round_trip(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    from tapekit.testing.tiny import TinyConfig, load_tiny, save_tiny

    model, tok = tiny
    save_tiny(model, tok, tmp_path / "m", TinyConfig(**SMALL))
    assert (tmp_path / "m" / "tiny_config.json").is_file()
    model2, tok2 = load_tiny(tmp_path / "m")
    assert _weights_equal(model, model2)
    assert tok2.chat_template == tok.chat_template
    assert tok2.get_vocab() == tok.get_vocab()
    with pytest.raises(FileNotFoundError, match="not a saved tiny model"):
        load_tiny(tmp_path / "missing")


def test_config_errors_name_the_field() -> None:
    from tapekit.testing.tiny import TinyConfig

    with pytest.raises(ValueError, match="hidden_size"):
        TinyConfig(hidden_size=100, num_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        TinyConfig(vocab_size=100)
    with pytest.raises(ValueError, match="whole_numbers"):
        TinyConfig(whole_numbers=-1)
    with pytest.raises(ValueError, match="num_layers"):
        TinyConfig(num_layers=0)


def test_the_tiny_model_learns_a_reply_and_stops_at_end_of_turn(tmp_path: Path) -> None:
    """A few optimiser steps on one conversation make greedy decoding reproduce the assistant
    turn and stop at <|im_end|>; the saved directory then runs as a TransformersLLM."""
    import torch

    from tapekit import Prompt
    from tapekit.llm.transformers import TransformersLLM
    from tapekit.testing.tiny import TinyConfig, make_tiny, save_tiny

    model, tok = make_tiny(TEXTS, TinyConfig(**SMALL))
    prompt_messages = MESSAGES[:2]
    reply = "calculator: 12+30"
    conversation = [*prompt_messages, {"role": "assistant", "content": reply}]
    full = tok.apply_chat_template(conversation, tokenize=False)
    prompt = tok.apply_chat_template(prompt_messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(full, add_special_tokens=False)["input_ids"]])
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    labels = ids.clone()
    labels[0, :n_prompt] = -100
    model.train()
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
    save_tiny(model.eval(), tok, tmp_path / "trained")
    llm = TransformersLLM(
        model_name="tiny",
        model_path=str(tmp_path / "trained"),
        device="cpu",
        parameters={"max_new_tokens": 30, "do_sample": False},
    )
    output = llm.generate(Prompt(messages=prompt_messages))
    assert output.content == reply
