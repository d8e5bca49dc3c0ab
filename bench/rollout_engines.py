"""The web student's RL rollouts through two engines: llama.cpp, and ``BatchedTransformersLLM``
on the training weights.

The policy is SmolLM2-135M-Instruct with a LoRA adapter (``--adapter DIR``: a saved PEFT
adapter; default: a random rank-16 adapter whose B is scaled by ``--scale``, so both engines
decode the same non-trivial policy), llama.cpp applying the adapter on the Q4_1 base file; or a
fully fine-tuned model (``--model DIR``, e.g. the teacherless study's student), which llama.cpp
decodes from a whole q8_0 export (what ``rollouts.engine: llamacpp`` publishes for a run without
LoRA), with one and with two threads. Each engine plays the same groups of MiniWob++ episodes
(``--tasks``, ``--seeds`` training seeds each, ``--k`` samples per seed at temperature
``--temperature``) in headless Chromium through the web agent the study trains
(``constrain="page"``, no rationale). Reported per engine: wall seconds, episodes per minute,
sampled tokens per second, success, and the seconds to convert the adapter for llama.cpp.

Then the question RL cares about: the ratio ``exp(logp_train - logp_sampled)`` between the
trainer's log-probability of each sampled token (the fp32 training model with the adapter,
logits divided by the temperature, no grammar: what ``train_rl`` computes) and the log-prob
the engine recorded when it sampled. On the first step after an update the ratio should be 1;
how far it is from 1, and the share of tokens outside the clip range ``[1 - eps, 1 + eps]``,
says whether PPO's clipping absorbs the engine difference.

    python bench/rollout_engines.py                       # ~10 minutes on 2 cores
    python bench/rollout_engines.py --adapter OUT/sft/final --k 8 --seeds 2
    python bench/rollout_engines.py --model docs/experiments/web-teacherless/run/sft/final \
        --tasks teacherless --seeds 2 --k 2 --temperature 0.7   # one step of the teacherless study
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TASKS = "click-button,click-link,click-tab,click-dialog"
PLAIN = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}


def policy(args: argparse.Namespace) -> tuple[Any, Any]:
    """The fp32 policy and its tokenizer: SmolLM2 with its LoRA adapter (PEFT), or ``--model``."""
    import torch

    from tapekit.llm import TransformersLLM

    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(args.model)
    from peft import LoraConfig, PeftModel, get_peft_model

    model, tokenizer = TransformersLLM(device="cpu", dtype="float32").load()  # de-quantised, plain
    if args.adapter:
        return PeftModel.from_pretrained(model, args.adapter).eval(), tokenizer
    torch.manual_seed(0)
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    peft = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft.named_parameters():
            if "lora_B" in name:
                parameter.mul_(args.scale)
    return peft.eval(), tokenizer


def trainer_logprobs(model: Any, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """What the trainer computes for the sampled tokens: log-softmax of logits / T."""
    import torch

    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    picked = torch.log_softmax(logits, -1)[torch.arange(len(output)), torch.tensor(output)]
    return [float(x) for x in picked]


def play(name: str, llm: Any, env: Any, tasks: list[Any], k: int) -> tuple[dict[str, Any], list[Any]]:
    """The episodes of one engine: timing, tokens, success, and its calls' token traces."""
    from tapekit import evaluate
    from tapekit.web import web_agent
    from tapekit.web.miniwob import reward_scorer

    agent = web_agent(llm, name="student", constrain="page", rationale=False)
    started = time.perf_counter()
    report = evaluate(
        agent, env, tasks, reward_scorer, k=k, name=f"bench-{name}", max_concurrency=len(tasks) * k
    )
    wall = time.perf_counter() - started
    traces = [c.tokens for c in report.llm_calls.values() if c.tokens is not None]
    sampled = sum(len(t.output_ids) for t in traces)
    episodes = len(report.samples)
    row = {
        "engine": name,
        "episodes": episodes,
        "wall_s": round(wall, 1),
        "episodes_per_min": round(60 * episodes / wall, 1),
        "llm_calls": len(report.llm_calls),
        "sampled_tokens": sampled,
        "sampled_tokens_per_s": round(sampled / wall, 1),
        "success": round(report.mean_score().value, 3),
    }
    return row, traces


def ratios(model: Any, traces: list[Any], temperature: float, eps: float, limit: int) -> dict[str, Any]:
    """The trainer/sampler ratio over the sampled tokens of up to ``limit`` calls."""
    gaps: list[float] = []
    for trace in traces[:limit]:
        if not trace.output_ids or trace.output_logprobs is None:
            continue
        mine = trainer_logprobs(model, trace.prompt_ids, trace.output_ids, temperature)
        gaps += [t - s for t, s in zip(mine, trace.output_logprobs, strict=True)]
    if not gaps:
        return {"tokens": 0}
    outside = sum(1 for g in gaps if not (1 - eps) <= math.exp(g) <= (1 + eps))
    return {
        "tokens": len(gaps),
        "mean_abs_logprob_gap": round(statistics.fmean(abs(g) for g in gaps), 4),
        "mean_logprob_gap": round(statistics.fmean(gaps), 4),
        "max_abs_logprob_gap": round(max(abs(g) for g in gaps), 3),
        "share_outside_clip": round(outside / len(gaps), 4),
        "eps": eps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--adapter", help="a saved PEFT LoRA adapter of SmolLM2 (default: random)")
    parser.add_argument("--scale", type=float, default=0.1, help="the random adapter's B scale")
    parser.add_argument("--model", help="a fully fine-tuned SmolLM2 directory (instead of an adapter)")
    parser.add_argument("--tasks", default=TASKS, help="comma-separated, or 'teacherless' (its RL tasks)")
    parser.add_argument("--seeds", type=int, default=2, help="training seeds per task")
    parser.add_argument("--k", type=int, default=8, help="episodes per seed (the GRPO group)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--eps", type=float, default=0.2, help="PPO clip range")
    parser.add_argument("--ratio-calls", type=int, default=200, help="calls whose ratios are computed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    import torch

    from tapekit.evaluate import Task
    from tapekit.llm import BatchedTransformersLLM, LlamaCppLLM, export_lora_gguf, export_model_gguf
    from tapekit.llm.llamacpp import smollm2_path
    from tapekit.web import WebEnvironment
    from tapekit.web.miniwob import SPLIT, TEACHERLESS_TASKS, start_tape

    torch.set_num_threads(args.threads)
    model, tokenizer = policy(args)
    if args.tasks == "teacherless":
        names = list(TEACHERLESS_TASKS)
    else:
        names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    tasks = [
        Task(id=f"{t}/{s}", start=start_tape(t, s), category=t)
        for t in names
        for s in SPLIT.train_seeds[: args.seeds]
    ]
    folder = Path(tempfile.mkdtemp(prefix="tapekit-bench-"))
    sampling = {"temperature": args.temperature, "max_tokens": 64}  # the study's cap (its schema's bound)
    engines: dict[str, Any] = {
        "transformers-batched": BatchedTransformersLLM.from_model(model, tokenizer, **sampling)
    }
    plain = {**sampling, **PLAIN}  # llama.cpp's top-k/p, min-p and penalty off: the same distribution
    convert: dict[str, float] = {}
    if args.model:  # a whole model file per version: the first export parses the base file's metadata
        for when in ("first", "next"):
            started = time.perf_counter()
            gguf = export_model_gguf(model, smollm2_path(), folder / f"model-{when}.gguf", "q8_0")
            convert[f"export_q8_0_{when}_s"] = round(time.perf_counter() - started, 3)
        for threads in (1, 2):
            engines[f"llama.cpp-q8_0-{threads}t"] = LlamaCppLLM(
                model_path=str(gguf), n_threads=threads, parameters=plain, seed=1
            )
    else:
        started = time.perf_counter()
        gguf = export_lora_gguf(model, smollm2_path(), folder / "adapter.gguf")
        convert["convert_adapter_s"] = round(time.perf_counter() - started, 3)
        engines["llama.cpp-lora"] = LlamaCppLLM(
            lora_path=str(gguf), n_threads=args.threads, parameters=plain, seed=1
        )
    engines["transformers-batched"].batcher.max_wait_s = 0.5
    results: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch_threads": args.threads,
            "load_before": list(os.getloadavg()),
        },
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        **convert,
        "engines": [],
    }
    with WebEnvironment(max_concurrent=len(tasks) * args.k, timeout_s=30) as env:
        for name, llm in engines.items():  # untimed: the browser's pages and each engine's first load
            play(f"warmup-{name}", llm, env, tasks[:1], 1)
        for name, llm in engines.items():
            row, traces = play(name, llm, env, tasks, args.k)
            row["ratio_vs_trainer"] = ratios(model, traces, args.temperature, args.eps, args.ratio_calls)
            results["engines"].append(row)
            print(json.dumps(row), flush=True)
    results["machine"]["load_after"] = list(os.getloadavg())
    print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
