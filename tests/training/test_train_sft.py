"""SFT on token-exact samples: masked tokens give no loss and no gradient, packing without
cross-sample attention (packed loss == unpacked loss), resuming from a checkpoint gives the
weights of an unbroken run, and the result loads back (full model and LoRA adapter)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tapekit.errors import TrainingError
from tapekit.training._data import split_packed
from tapekit.training.config import SFTConfig, load_config, parse_overrides
from tapekit.training.sft import build_sft_trainer, labelled, train_sft
from tests.training.train_helpers import make_model, sum_rows


def config(tmp: Path, **kw: Any) -> SFTConfig:
    base: dict[str, Any] = {
        "output_dir": str(tmp),
        "max_steps": 4,
        "logging_steps": 2,
        "max_length": 96,
        "batch_size": 2,
        "learning_rate": 1e-3,
        "lora": None,
        "device": "cpu",
    }
    return SFTConfig(**{**base, **kw})


def token_losses(model: Any, ids: list[int], labels: list[int]) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1]
    target = torch.tensor(labels[1:])
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction="none")


def test_labels_follow_the_mask_and_masked_tokens_get_no_gradient(tmp_path: Path) -> None:
    model, tok = make_model()
    rows = sum_rows(tok, 4)
    data = labelled(__import__("datasets").Dataset.from_list(rows))
    for row, out in zip(rows, data, strict=True):
        assert out["labels"] == [
            t if m else -100 for t, m in zip(row["input_ids"], row["loss_mask"], strict=True)
        ]
    # the gradient of the loss reaches only the logits that predict trained tokens
    ids, labels = data[0]["input_ids"], data[0]["labels"]
    model.train()
    out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]), use_cache=False)
    out.logits.retain_grad()
    out.loss.backward()
    grad_norm = out.logits.grad[0].abs().sum(-1)  # position t predicts token t+1
    predicts_trained = torch.tensor([m == 1 for m in rows[0]["loss_mask"][1:]] + [False])
    assert (grad_norm[~predicts_trained] == 0).all() and (grad_norm[predicts_trained] > 0).all()
    # the loss is the mean over trained tokens only
    assert out.loss.item() == pytest.approx(
        token_losses(model, ids, labels).sum().item() / sum(rows[0]["loss_mask"][1:])
    )


def test_packed_batch_loss_equals_unpacked_loss(tmp_path: Path) -> None:
    model, tok = make_model()
    # float32: dtype "auto" is bf16 autocast on a CPU with bf16 instructions, and the packed
    # loss would then be compared in bf16 with an unpacked one in fp32 (7e-5 apart)
    trainer = build_sft_trainer(sum_rows(tok, 24), model, tok, config(tmp_path, dtype="float32"))
    batch = next(iter(trainer.get_train_dataloader()))
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 2  # two packed rows, no mask
    pad = trainer.data_collator.pad_token_id
    samples = list(split_packed(batch["input_ids"], batch["position_ids"], None, pad))
    label_rows = list(split_packed(batch["labels"], batch["position_ids"], None, -100))
    assert [len(x) for x in label_rows] == [len(x) for x in samples]
    assert len(samples) >= 4  # several samples really share the row
    trainer.model.eval()
    with torch.no_grad():
        packed = trainer.compute_loss(trainer.model, dict(batch)).item()
        total, count = 0.0, 0
        for ids, labels in zip(samples, label_rows, strict=True):
            losses = token_losses(trainer.model, ids, labels)
            total += losses.sum().item()
            count += sum(lbl != -100 for lbl in labels[1:])
        # the same row with attention across samples (no position ids) gives another loss
        crossed = trainer.model(
            input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False
        ).loss.item()
    assert packed == pytest.approx(total / count, rel=1e-5)
    assert abs(crossed - packed) > 1e-3


def test_resume_from_checkpoint_equals_unbroken_run(tmp_path: Path) -> None:
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                control.should_training_stop = True

    model, tok = make_model()
    rows = sum_rows(tok, 40)
    unbroken = train_sft(
        rows, model, tokenizer=tok, config=config(tmp_path / "a", save_steps=2, max_length=48)
    )
    model, tok = make_model()
    train_sft(
        rows,
        model,
        tokenizer=tok,
        config=config(tmp_path / "b", save_steps=2, max_length=48),
        callbacks=[StopAt()],
    )
    assert (tmp_path / "b" / "checkpoint-2").is_dir() and not (tmp_path / "b" / "checkpoint-4").exists()
    model, tok = make_model()
    resumed = train_sft(
        rows, model, tokenizer=tok, config=config(tmp_path / "b", save_steps=2, max_length=48, resume=True)
    )
    from safetensors.torch import load_file

    a, b = load_file(unbroken / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    info = json.loads((resumed / "tapekit_train.json").read_text())
    assert info["global_step"] == 4 and info["lora"] is False
    fresh, _ = make_model()
    assert not torch.equal(fresh.state_dict()["model.embed_tokens.weight"], a["model.embed_tokens.weight"])


def test_lora_result_loads_back_and_learned(tmp_path: Path) -> None:
    from peft import PeftModel

    base_dir = tmp_path / "base"
    _model, tok = make_model(base_dir)
    rows = sum_rows(tok, 40)
    cfg = config(
        tmp_path / "lora", lora={"r": 16, "alpha": 32}, max_steps=12, learning_rate=1e-2, logging_steps=10
    )
    adapter = train_sft(rows, str(base_dir), config=cfg)
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "model.safetensors").exists()
    base, _ = make_model()
    tuned = PeftModel.from_pretrained(base, str(adapter)).eval()
    plain, _ = make_model()
    data = labelled(__import__("datasets").Dataset.from_list(rows[:8]))
    with torch.no_grad():
        before = sum(token_losses(plain.eval(), r["input_ids"], r["labels"]).sum().item() for r in data)
        after = sum(token_losses(tuned, r["input_ids"], r["labels"]).sum().item() for r in data)
    assert after < 0.95 * before  # LoRA on a random tiny model learns slowly; it must learn


def test_bad_samples_and_configs_are_named(tmp_path: Path) -> None:
    model, tok = make_model()
    rows = sum_rows(tok, 3)
    bad = [dict(rows[0]), dict(rows[1], loss_mask=rows[1]["loss_mask"][:-1])]
    with pytest.raises(
        TrainingError, match=r"sample 1 \(tape t1\): input_ids has \d+ tokens but loss_mask has"
    ):
        train_sft(bad, model, tokenizer=tok, config=config(tmp_path))
    with pytest.raises(TrainingError, match="all 0"):
        train_sft(
            [dict(rows[0], loss_mask=[0] * len(rows[0]["input_ids"]))],
            model,
            tokenizer=tok,
            config=config(tmp_path),
        )
    with pytest.raises(TrainingError, match="more than max_length=5"):
        train_sft(rows, model, tokenizer=tok, config=config(tmp_path, max_length=5))
    with pytest.raises(TrainingError, match="not a local model directory"):
        train_sft(rows, str(tmp_path / "nowhere"), config=config(tmp_path))
    with pytest.raises(TrainingError, match="no checkpoint"):
        train_sft(rows, model, tokenizer=tok, config=config(tmp_path / "fresh", resume=True))
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("max_steps: 3\nlora:\n  r: 4\nlerning_rate: 1\n")
    with pytest.raises(ValueError, match="lerning_rate: Extra inputs"):
        load_config(SFTConfig, cfg_file)
    cfg_file.write_text("max_steps: 3\nlora:\n  r: 4\nmodel: m\n")
    loaded = load_config(SFTConfig, cfg_file, parse_overrides(["lora.alpha=8", "max_length=64"]))
    assert (loaded.max_steps, loaded.lora.r, loaded.lora.alpha, loaded.max_length) == (3, 4, 8, 64)
    assert loaded.model == str(tmp_path / "m")
    cfg_file.write_bytes(b"max_steps: 3\nmodel: caf\xe9\n")  # latin-1, not UTF-8
    with pytest.raises(ValueError, match=r"c\.yaml, line 2: not valid UTF-8 \(byte 0xe9\)"):
        load_config(SFTConfig, cfg_file)


def test_a_tracker_not_installed_or_unknown_is_a_training_error_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.integrations.integration_utils as integrations

    import tapekit.training.sft as sft

    monkeypatch.setattr(integrations, "is_wandb_available", lambda: False)  # as if wandb were missing
    loaded: list[Any] = []
    load = sft.load_model_and_tokenizer
    monkeypatch.setattr(sft, "load_model_and_tokenizer", lambda *a: loaded.append(a) or load(*a))
    model, tok = make_model()
    rows = sum_rows(tok, 3)
    with pytest.raises(
        TrainingError, match=r"report_to 'wandb' needs its package installed .*pip install wandb"
    ):
        train_sft(rows, model, tokenizer=tok, config=config(tmp_path, report_to=["wandb"]))
    with pytest.raises(TrainingError, match="report_to: madeup is not supported"):
        train_sft(rows, model, tokenizer=tok, config=config(tmp_path, report_to=["madeup"]))
    assert loaded == [] and list(tmp_path.iterdir()) == []  # no model loaded, nothing written


def test_check_report_to_reads_none_and_all_as_transformers_does() -> None:
    from tapekit.training.callbacks import check_report_to

    for fine in ([], ["none"], ["all"]):  # "all": every installed tracker (none is, here)
        check_report_to(fine)
    with pytest.raises(TrainingError, match="a list of tracker names, not the string 'wandb'"):
        check_report_to("wandb")


def test_group_by_length_batches_have_less_padding(tmp_path: Path) -> None:
    model, tok = make_model()
    rows = sum_rows(tok, 48)
    for i, row in enumerate(rows):  # lengths from short to long, shuffled by the sampler
        extra = row["input_ids"][:4] * (i % 8)
        row["input_ids"], row["loss_mask"] = extra + row["input_ids"], [0] * len(extra) + row["loss_mask"]

    def padding_share(grouped: bool) -> float:
        cfg = config(tmp_path / str(grouped), packing=False, group_by_length=grouped, batch_size=4)
        trainer = build_sft_trainer(rows, model, tok, cfg)
        pads = total = 0
        for batch in trainer.get_train_dataloader():
            pads += int((batch["attention_mask"] == 0).sum())
            total += batch["attention_mask"].numel()
        return pads / total

    grouped, random_order = padding_share(True), padding_share(False)
    assert grouped < 0.6 * random_order
    with pytest.raises(ValueError, match="packing=False"):
        SFTConfig(group_by_length=True)


def test_step_callbacks_see_typed_records_and_stop_the_trainer(tmp_path: Path) -> None:
    from tapekit.training.callbacks import StepCallback, StepRecord, StopAfter

    class Keep(StepCallback):
        def __init__(self) -> None:
            self.records: list[StepRecord] = []

        def on_step(self, record: StepRecord) -> bool | None:
            self.records.append(record)
            return None

    keep = Keep()
    model, tok = make_model()
    final = train_sft(
        sum_rows(tok, 40),
        model,
        tokenizer=tok,
        config=config(tmp_path, max_steps=6, max_length=48),
        callbacks=[StopAfter(steps=3), keep],
    )
    assert [r.step for r in keep.records] == [1, 2, 3] and {r.trainer for r in keep.records} == {"sft"}
    losses = [r.loss for r in keep.records]  # logging_steps=2: the loss comes on step 2 only
    assert losses[0] is None and losses[2] is None and isinstance(losses[1], float) and losses[1] > 0
    assert "learning_rate" in keep.records[1].metrics and all(r.step_seconds > 0 for r in keep.records)
    assert all(r.tokens for r in keep.records)
    info = json.loads((final / "tapekit_train.json").read_text())
    assert info["global_step"] == 3 and "3 steps" in info["stopped"]


def decoder_dtypes(tmp: Path, dtype: str) -> set[torch.dtype]:
    """The dtypes one SFT step's decoder computes in (an MLP projection's outputs), fp32 weights."""
    model, tok = make_model()
    seen: list[torch.dtype] = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    build_sft_trainer(sum_rows(tok, 8), model, tok, config(tmp, max_steps=1, dtype=dtype)).train()
    return set(seen)


def test_bfloat16_autocasts_the_labelled_head_loss_of_an_fp32_model(tmp_path: Path) -> None:
    # the labelled-only head calls the decoder directly, around accelerate's autocast wrapper
    # of model.forward: dtype bfloat16 must still run the decoder in bf16 (and float32 in fp32)
    assert decoder_dtypes(tmp_path / "bf16", "bfloat16") == {torch.bfloat16}
    assert decoder_dtypes(tmp_path / "fp32", "float32") == {torch.float32}


def test_a_peft_model_trains_its_own_adapter_and_bad_models_are_named(tmp_path: Path) -> None:
    from peft import get_peft_model

    from tapekit.training.config import LoraSettings

    model, tok = make_model()
    rows = sum_rows(tok, 16)
    peft_config = LoraSettings(r=2, alpha=4, dropout=0.1).peft_config()
    assert (peft_config.r, peft_config.lora_alpha, peft_config.lora_dropout) == (2, 4, 0.1)
    assert peft_config.target_modules == "all-linear" and peft_config.task_type == "CAUSAL_LM"
    adapter = get_peft_model(model, peft_config)
    base_before = {n: p.detach().clone() for n, p in adapter.named_parameters() if "lora_" not in n}
    with pytest.raises(TrainingError, match="already carries a LoRA adapter"):
        train_sft(rows, adapter, tokenizer=tok, config=config(tmp_path / "a", lora=LoraSettings(r=2)))
    train_sft(rows, adapter, tokenizer=tok, config=config(tmp_path / "b", max_steps=2))
    lora_b = [p for n, p in adapter.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # B starts at zero: trained
    assert all(torch.equal(p, base_before[n]) for n, p in adapter.named_parameters() if n in base_before)
    assert (tmp_path / "b" / "final" / "adapter_config.json").exists()
    with pytest.raises(TrainingError, match="not object"):
        train_sft(rows, object(), tokenizer=tok, config=config(tmp_path / "c"))
