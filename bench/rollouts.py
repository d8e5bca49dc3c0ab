"""Rollout decoding speed: the batched sampler of the RL rollouts against ``generate``'s own sampling.

``BatchedTransformersLLM.generate_batch`` decodes every waiting request in one left-padded
``generate``. It samples each token with its own logits processor (transformers' temperature,
top-k and top-p warpers, then one uniform draw per row through the cumulative distribution)
and records the drawn token's log-prob as it goes. ``generate(do_sample=True)`` instead calls
``torch.multinomial`` over the whole vocabulary at every step, and its log-probs come from the
stacked ``output_scores`` afterwards (what tapekit did before). This script decodes the same
padded batch both ways, for a fixed number of tokens so that both do the same work, and then
times one RL step's rollouts of the math student (tasks x attempts through tapes, the batch
runner and the store) to show what share of a step decoding is.

    python bench/rollouts.py                                  # a tiny model (random weights)
    python bench/rollouts.py --model OUT/sft-tiny/final       # a saved tiny student
    python bench/rollouts.py --device cuda --threads 8
    python bench/rollouts.py --device cuda --arch smollm2     # SmolLM2-135M's shape, bf16
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model and tokenizer: ``--model`` when given, else a tiny model with random weights
    on a tokenizer trained here on the math problems (nothing is downloaded)."""
    from examples.math_study.problems import make_problems
    from tapekit.testing.tiny import TinyConfig, load_tiny, make_tiny

    if args.model:
        model, tokenizer = load_tiny(args.model)
    else:
        texts = [p.question for p in make_problems(600, seed=1)]
        model, tokenizer = make_tiny(texts, TinyConfig(whole_numbers=2000))  # the math students' shape
    if args.arch == "smollm2":  # SmolLM2-135M's architecture, random weights, the tiny tokenizer's ids
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
            rope_theta=100000.0, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        torch.manual_seed(0)
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        model = LlamaForCausalLM(config).to(dtype)
    return model.to(args.device).eval(), tokenizer


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` math questions as chat prompts (token ids), of different lengths."""
    from examples.math_study.problems import make_problems

    out = []
    for p in make_problems(n, seed=2):
        message = [{"role": "user", "content": p.question}]
        ids = tokenizer.apply_chat_template(message, add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def multinomial(llm: Any, rows: list[list[int]], tokens: int, seed: int) -> float:
    """One ``generate(do_sample=True, output_scores=True)`` of ``rows`` and the log-prob
    table of its draws; returns the seconds."""
    import torch

    from tapekit.llm.batched import left_pad
    from tapekit.llm.transformers import _pad_id

    model, tokenizer = llm.load()
    pad = _pad_id(tokenizer)  # the pad generate_batch uses (eos when there is none)
    if pad is None:
        raise SystemExit("bench/rollouts.py: the tokenizer has neither a pad nor an eos token")
    ids, mask = left_pad(rows, pad)
    width = ids.shape[1]
    started = time.perf_counter()
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            pad_token_id=pad,
            do_sample=True,
            temperature=llm.temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            return_dict_in_generate=True,
            output_scores=True,
        )
        table = torch.log_softmax(torch.stack(list(out.scores), dim=1).float(), dim=-1)
        table.gather(2, out.sequences[:, width:].unsqueeze(-1)).cpu()
    return time.perf_counter() - started


def sampler(llm: Any, rows: list[list[int]], seed: int) -> float:
    """One ``generate_batch`` of ``rows`` (the batched sampler); returns the seconds."""
    started = time.perf_counter()
    llm.generate_batch(rows, seed)
    return time.perf_counter() - started


def rl_step(model: Any, tokenizer: Any, args: argparse.Namespace) -> dict[str, float]:
    """One RL step's rollouts of the math student: the wall time, the time in ``generate`` and
    the sampled tokens."""
    from examples.math_study.problems import make_problems
    from examples.math_study.rl_stage import math_setup
    from tapekit.store import open_store
    from tapekit.training.rl import LocalPolicy, collect_rollouts

    setup = math_setup(make_problems(args.tasks * 4, seed=3))
    policy = LocalPolicy(model, tokenizer, temperature=args.temperature, max_tokens=48)
    policy.publish(model, 0)
    policy.activate()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(str(Path(tmp) / "rollouts.db"))
        walls = []
        for step in range(args.repeat + 1):  # the first step warms up
            before = (policy.batcher.stats.generate_s, policy.batcher.stats.output_tokens)
            started = time.perf_counter()
            collect_rollouts(
                setup.agent_for(policy.llm),
                setup.environment,
                setup.tasks[step * args.tasks : (step + 1) * args.tasks],
                setup.scorers,
                reward="strict",
                group_size=args.group,
                step=step,
                policy_version=0,
                store=store,
                max_loops=8,
                batcher=policy.batcher,
                seed=step,
            )
            if step:
                walls.append(
                    (
                        time.perf_counter() - started,
                        policy.batcher.stats.generate_s - before[0],
                        policy.batcher.stats.output_tokens - before[1],
                    )
                )
        store.close()
    wall, gen, tokens = (sum(w[i] for w in walls) / len(walls) for i in range(3))
    return {"wall_s": wall, "generate_s": gen, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None, help="a saved tiny model (default: random)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--arch",
        choices=["tiny", "smollm2"],
        default="tiny",
        help="smollm2: its architecture, random weights",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--rows", type=int, default=128, help="requests decoded together")
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per row")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (the median is shown)")
    parser.add_argument("--tasks", type=int, default=16, help="RL step: tasks")
    parser.add_argument("--group", type=int, default=8, help="RL step: attempts per task")
    args = parser.parse_args()

    import torch
    import transformers

    from tapekit.llm.batched import BatchedTransformersLLM

    torch.set_num_threads(args.threads)
    model, tokenizer = load(args)
    llm = BatchedTransformersLLM.from_model(
        model,
        tokenizer,
        temperature=args.temperature,
        max_tokens=args.tokens,
        parameters={"min_new_tokens": args.tokens},
    )
    rows = prompts(tokenizer, args.rows)
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} torch {torch.__version__} "
        f"transformers {transformers.__version__} device {args.device} threads {args.threads}"
    )
    print(
        f"model: {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"vocabulary {model.config.vocab_size}; "
        f"{args.rows} rows x {args.tokens} tokens, prompts {min(map(len, rows))}-{max(map(len, rows))} tokens"
    )
    multinomial(llm, rows[:8], 4, 0), sampler(llm, rows[:8], 0)  # warm up
    times: dict[str, list[float]] = {"generate(do_sample)": [], "batched sampler": []}
    for seed in range(args.repeat):
        times["generate(do_sample)"].append(multinomial(llm, rows, args.tokens, seed))
        times["batched sampler"].append(sampler(llm, rows, seed))
    base = statistics.median(times["generate(do_sample)"])
    for name, runs in times.items():
        s = statistics.median(runs)
        print(
            f"{name:20s} {s:6.3f} s  {args.rows * args.tokens / s:8.0f} tokens/s  "
            f"{1000 * s / args.tokens:6.2f} ms per step  x{base / s:.2f}"
        )
    step = rl_step(model, tokenizer, args)
    print(
        f"one RL step's rollouts ({args.tasks} tasks x {args.group}): {step['wall_s']:.2f} s, "
        f"{step['generate_s']:.2f} s of it in generate ({step['generate_s'] / step['wall_s']:.0%}), "
        f"{step['tokens']:.0f} sampled tokens, {step['tokens'] / step['wall_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
