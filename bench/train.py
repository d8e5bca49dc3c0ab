"""SFT throughput on tape-made samples: tapekit's packed path vs TRL at its best and transformers.Trainer.

The samples come from tapes: an agent answers arithmetic questions after a conversation history
of 0-12 earlier exchanges (so lengths vary, as in multi-turn agent data), run by
``tapekit.evaluate`` on a backend that records token ids; each LLM call becomes one sample
(prompt ids masked, sampled ids trained). The same samples are then trained for one epoch by:

  tapekit            tapekit.training.sft: TRL's SFTTrainer, BFD packing, padding-free rows kept as
                     rows (PackedRowsCollator), the model's loss with the LM head on labelled
                     positions only
  tapekit-full-head  the same with the labelled-only head off (the model's own loss, full logits)
  tapekit-joined     also without the rows-as-rows collator: TRL's padding-free collator joins a
                     step's packed rows into one row; what is left of tapekit is the model's loss
                     in place of TRL's (the gap to ``trl`` is TRL's loss)
  trl                TRL SFTTrainer at its best: packing=True (BFD), padding_free=True (the fields
                     the installed TRL has), the same rows per step and row length as tapekit,
                     completion-only loss
  trl-padded         TRL SFTTrainer with its default padding collator (completion-only loss)
  trainer            plain transformers.Trainer with DataCollatorForSeq2Seq (pads to the batch's longest)

The chain trl -> tapekit-joined -> tapekit-full-head -> tapekit switches tapekit's features on one
at a time, so each ratio is the gain of one of them: the model's loss instead of TRL's, packed
rows kept as rows, the labelled-only head.

Each mode runs in its own process (so peak memory is its own) and reports real (non-pad) tokens
per second, the share of real tokens in what the model computed on, peak memory and the number
of trained (label) tokens, which must be equal in every mode (the same data).

    python bench/train.py                                  # tiny model on CPU
    python bench/train.py --device cuda --model smollm2     # SmolLM2-135M bf16, full and LoRA

``--model smollm2`` uses ``--model-path`` when given, else the SmolLM2-135M architecture with
random weights (throughput does not depend on the weights; nothing is downloaded).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tapekit import Agent, Node, Observation, Prompt, StopStep, Tape, ToolEnvironment
from tapekit.core import LLMOutput
from tapekit.dialog import AssistantThought
from tapekit.evaluate import Score, Task, evaluate
from tapekit.llm.base import LLM, LLMEvent, TokenTrace

PACKED = ("tapekit", "tapekit-full-head", "tapekit-joined", "trl")
MODES = ("tapekit", "tapekit-full-head", "tapekit-joined", "trl", "trl-padded", "trainer")


class Exchange(Observation):
    """A question after a history of earlier questions and answers."""

    kind: Literal["bench_train.exchange"] = "bench_train.exchange"
    history: list[tuple[str, str]]
    question: str


class Tutor(Node):
    """Answers the question with the whole history in the prompt."""

    name: str = "tutor"

    def make_prompt(self, agent: Any, tape: Tape[Any, Any]) -> Prompt:
        first = tape.steps[0]
        messages: list[dict[str, Any]] = [{"role": "system", "content": "Answer with the number."}]
        for q, a in first.history:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": first.question})
        return Prompt(messages=messages)

    def generate_steps(self, agent: Any, tape: Tape[Any, Any], llm_stream: Any) -> Any:
        yield AssistantThought(content=llm_stream.get_text())
        yield StopStep()


class OracleLLM(LLM):
    """Answers correctly and records token ids like a local backend (chat template applied)."""

    model_name: str = "oracle"
    tokenizer: Any = None

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return self._answer(prompt)

    async def _answer(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        question = prompt.messages[-1]["content"]
        answer = str(eval(question.removeprefix("What is ").rstrip("?")))  # the bench's own questions
        text = self.tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out = self.tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        yield LLMEvent(
            output=LLMOutput(content=answer),
            tokens=TokenTrace(prompt_ids=ids, output_ids=out, tokenizer="tiny"),
            prompt_tokens=len(ids),
            output_tokens=len(out),
        )


def _question(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.randrange(100), rng.randrange(100), rng.randrange(10)
    q = f"What is {a} + {b} * {c}?"
    return q, str(a + b * c)


def make_samples(n: int, seed: int, directory: Path) -> tuple[Path, Path]:
    """Tape-made samples (``samples.jsonl``) and the tiny tokenizer/model dir they use."""
    from tapekit.testing.tiny import TinyConfig, make_tiny

    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        history = [_question(rng) for _ in range(rng.randrange(13))]
        question, answer = _question(rng)
        start = Tape(steps=[Exchange(history=history, question=question)])
        tasks.append(Task(id=f"q{i}", start=start, expected=answer))
    corpus = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n" for q, a in
              (_question(rng) for _ in range(400))]  # fmt: skip
    tiny_dir = directory / "tiny"
    _, tokenizer = make_tiny(
        corpus, TinyConfig(hidden_size=256, num_layers=4, intermediate_size=768), tiny_dir
    )
    agent = Agent.create("tutor", llms=OracleLLM(tokenizer=tokenizer), nodes=[Tutor()])

    def exact(tape: Tape[Any, Any], task: Task) -> Score:
        return Score(value=1.0, passed=tape.steps[-2].content == task.expected)

    report = evaluate(agent, ToolEnvironment([]), tasks, exact, name="bench-train")
    assert report.pass_at_1().value == 1.0
    path = directory / "samples.jsonl"
    with path.open("w") as f:
        for call in report.llm_calls.values():
            trace = call.tokens
            f.write(json.dumps({
                "input_ids": trace.prompt_ids + trace.output_ids,
                "loss_mask": [0] * len(trace.prompt_ids) + [1] * len(trace.output_ids),
                "tape_id": call.prompt.id,
            }) + "\n")  # fmt: skip
    return path, tiny_dir


# --------------------------------------------------------------------------- one mode (child process)


def _model(args: argparse.Namespace, tiny_dir: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    if args.model == "tiny":
        return AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True, dtype=dtype), tokenizer
    if args.model_path:
        model = AutoModelForCausalLM.from_pretrained(args.model_path, local_files_only=True, dtype=dtype)
        return model, tokenizer
    config = LlamaConfig(  # SmolLM2-135M's architecture
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rope_theta=100000.0, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype), tokenizer


def _count(trainer: Any) -> tuple[int, int]:
    """(computed tokens, trained tokens) over one epoch of the trainer's batches: every position
    the model runs on (padding included) and every label that is not -100."""
    total = trained = 0
    for batch in trainer.get_train_dataloader():
        total += batch["input_ids"].numel()
        trained += int((batch["labels"] != -100).sum())
    return total, trained


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset

    from tapekit.training.config import SFTConfig
    from tapekit.training.sft import build_sft_trainer

    rows = [json.loads(line) for line in Path(args.samples_file).read_text().splitlines()]
    model, tokenizer = _model(args, Path(args.tiny_dir))
    common = {
        "output_dir": tempfile.mkdtemp(),
        "per_device_train_batch_size": args.batch_size,
        "num_train_epochs": 1,
        "learning_rate": 1e-4,
        "logging_steps": 10**6,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": args.device == "cpu",
        "bf16": args.device == "cuda",
        "gradient_checkpointing": False,
        "seed": 0,
    }
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    mean_len = sum(len(r["input_ids"]) for r in rows) / len(rows)
    longest = max(len(r["input_ids"]) for r in rows)
    # packed rows as long as the longest sample, as many per step as hold a padded batch's tokens
    packed_len = -(-longest // 64) * 64
    rows_per_step = max(1, round(args.batch_size * mean_len / packed_len))
    if args.mode != "tapekit":  # the other modes run the LM head over every position
        import tapekit.training._head_loss as head_loss

        head_loss.plain_head_parts = lambda model: None
    if args.mode.startswith("tapekit"):
        config = SFTConfig(
            output_dir=common["output_dir"], epochs=1, batch_size=rows_per_step, max_length=packed_len,
            lora={"r": 16, "alpha": 32} if args.lora else None, device=args.device,
            dtype="bfloat16" if args.device == "cuda" else "float32", logging_steps=10**6, learning_rate=1e-4,
        )  # fmt: skip
        trainer = build_sft_trainer(rows, model, tokenizer, config)
        if args.mode == "tapekit-joined":  # TRL's own padding-free collator: one joined row per step
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

            trainer.data_collator = DataCollatorForLanguageModeling(
                pad_token_id=trainer.data_collator.pad_token_id, padding_free=True
            )
    elif args.mode.startswith("trl"):
        from trl import SFTConfig as TRLSFTConfig
        from trl import SFTTrainer

        data = Dataset.from_list(
            [{"input_ids": r["input_ids"], "completion_mask": r["loss_mask"]} for r in rows]
        )
        if args.mode == "trl":  # TRL's best: BFD packing, padding-free, tapekit's rows per step
            fields = {f.name for f in dataclasses.fields(TRLSFTConfig)}
            best = {"packing": True, "packing_strategy": "bfd", "padding_free": True}
            best = {k: v for k, v in best.items() if k in fields}
            batch = {"per_device_train_batch_size": rows_per_step, "max_length": packed_len}
            trl_args = TRLSFTConfig(**{**common, **batch}, completion_only_loss=True, **best)
        else:
            trl_args = TRLSFTConfig(**common, max_length=None, completion_only_loss=True, packing=False)
        trainer = SFTTrainer(
            model=model,
            args=trl_args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    else:
        from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

        if peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
        labelled = [
            {"input_ids": r["input_ids"], "labels": [t if m else -100 for t, m in zip(r["input_ids"], r["loss_mask"], strict=True)]}  # noqa: E501
            for r in rows
        ]  # fmt: skip
        trainer = Trainer(
            model=model,
            args=TrainingArguments(**common),
            train_dataset=Dataset.from_list(labelled),
            data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
        )
    real = sum(len(r["input_ids"]) for r in rows)  # each sample once per epoch, in every mode
    total, trained = _count(trainer)
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer.train()
    if args.device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if args.device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    return {
        "mode": args.mode,
        "seconds": seconds,
        "real_tokens": real,
        "computed_tokens": total,
        "trained_tokens": trained,
        "tokens_per_s": real / seconds,
        "real_share": real / total,
        "peak_mib": peak,
        "steps": trainer.state.global_step,
        "packed": f"{rows_per_step} rows of {packed_len}" if args.mode in PACKED else None,
    }


# --------------------------------------------------------------------------- driver


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=256, help="tapes (one sample each)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per padded batch")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--model-path", default=None, help="local weights for --model smollm2")
    parser.add_argument("--lora", action="store_true", help="LoRA r=16 instead of full training")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode (the median is shown)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--samples-file", help=argparse.SUPPRESS)
    parser.add_argument("--tiny-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print("RESULT " + json.dumps(run_mode(args)), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        samples, tiny_dir = make_samples(args.samples, args.seed, Path(tmp))
        lengths = [len(json.loads(x)["input_ids"]) for x in samples.read_text().splitlines()]
        mean = sum(lengths) / len(lengths)
        print(f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
        print(
            f"# {len(lengths)} tape-made samples, {min(lengths)}-{max(lengths)} tokens (mean {mean:.0f});"
            f" model={args.model} device={args.device} {'LoRA' if args.lora else 'full'}"
            f" batch={args.batch_size}"
        )
        header = ("mode", "tokens/s", "real share", "peak MiB", "trained tok", "steps", "s")
        print("{:17} {:>10} {:>10} {:>9} {:>11} {:>5} {:>6}".format(*header))
        for mode in args.modes.split(","):
            runs = []
            for _ in range(args.repeat):
                child = [sys.executable, __file__, "--mode", mode, "--samples-file", str(samples),
                         "--tiny-dir", str(tiny_dir), "--device", args.device, "--model", args.model,
                         "--batch-size", str(args.batch_size)]  # fmt: skip
                child += ["--lora"] if args.lora else []
                child += ["--model-path", args.model_path] if args.model_path else []
                done = subprocess.run(child, capture_output=True, text=True)
                line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"mode {mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
                runs.append(json.loads(line[7:]))
            r = sorted(runs, key=lambda x: x["tokens_per_s"])[len(runs) // 2]
            print(
                f"{mode:17} {r['tokens_per_s']:>10,.0f} {r['real_share']:>10.1%} {r['peak_mib']:>9,.0f}"
                f" {r['trained_tokens']:>11,} {r['steps']:>5} {r['seconds']:>6.1f}"
                + (f"   ({r['packed']} tokens per step)" if r["packed"] else "")
            )


if __name__ == "__main__":
    main()
