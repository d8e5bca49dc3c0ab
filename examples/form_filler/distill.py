"""Teacher -> student distillation for the form filler (section 5.4, "Agent Distillation").

1. :func:`for_student` prepares a teacher tape for the student: the teacher's intermediate
   ``gather_values`` / ``verify_values`` notes are left out (the student does not write them)
   and the simulated users' steps lose their ``agent`` label (the behaviour stays in their
   facts): to ``reuse``, a step made by an agent is one the student must reproduce.
2. :func:`student_samples`: ``student.reuse`` of every prepared tape, rendered with the
   student's tokenizer and chat template by :func:`tapekit.training.make_samples`; each
   distinct (prompt, output) pair once (sibling branches of a tree share their past turns).
3. :func:`tiny_student` / :func:`train_student` / :func:`student_llm`: a tiny model (its
   tokenizer trained on the student's conversations and the forms) fully fine-tuned, or
   SmolLM2-135M with LoRA, then loaded back with ``TransformersLLM``.
4. :func:`continue_branches`: the agent's next turn on partial dialogues (the starts of a test
   tree's branches), through the batch runner; GREADTH scores these continuations.
5. :func:`few_shot_demos`: for the few-shot baseline, ``k`` worked examples per student node
   (the student's prompt and the teacher's answer, rebuilt by ``student.reuse``) from training
   tapes, chosen deterministically.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.form_filler.agents import STUDENT_TEMPLATES, make_student
from examples.form_filler.environment import FormFillerEnvironment
from examples.form_filler.render import turn_context
from examples.form_filler.schema import FormSet
from examples.form_filler.steps import GatherValuesThought, VerifyValuesThought
from examples.form_filler.tree import Branch
from tapekit import Agent, FunctionLLM, ReconstructionError, StepSequence, Tape, UserStep
from tapekit.batch import batch

__all__ = [
    "Demo",
    "StudentConfig",
    "continue_branches",
    "demos_by_node",
    "few_shot_demos",
    "for_student",
    "student_llm",
    "student_samples",
    "tiny_student",
    "tokenizer_texts",
    "train_student",
]


def for_student(tape: Tape[Any, Any]) -> Tape[Any, Any]:
    """``tape`` without the teacher's gather/verify notes, user steps made by no agent."""
    steps = []
    for step in tape.steps:
        if isinstance(step, GatherValuesThought | VerifyValuesThought):
            continue
        if isinstance(step, UserStep) and step.metadata.agent:
            step = step.model_copy(update={"metadata": step.metadata.model_copy(update={"agent": ""})})
        steps.append(step)
    return tape.model_copy(update={"steps": StepSequence(steps)})


def reusable(tapes: Iterable[Tape[Any, Any]], student: Agent) -> list[Tape[Any, Any]]:
    """The prepared tapes that ``student.reuse`` can adapt (others are left out and counted)."""
    out, failed = [], 0
    for tape in tapes:
        prepared = for_student(tape)
        try:
            student.reuse(prepared)
        except (ReconstructionError, ValueError):
            failed += 1
            continue
        out.append(prepared)
    if failed:
        print(f"note: {failed} teacher tapes could not be adapted to the student: left out")
    return out


def student_samples(tapes: list[Tape[Any, Any]], student: Agent, tokenizer: Any) -> Any:
    """The student's training rows (a ``datasets.Dataset``) from prepared teacher tapes,
    each distinct row once."""
    from tapekit.training import make_samples

    rows = make_samples(tapes, reuse_with=student, tokenizer=tokenizer, merge=False).dataset
    seen: set[tuple[int, ...]] = set()
    keep = []
    for i, ids in enumerate(rows["input_ids"]):
        key = tuple(ids)
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return rows.select(keep)


@dataclass(frozen=True)
class Demo:
    """One worked example for the few-shot student: the ``node`` it is shown to, the student's
    ``prompt`` (the user message) and the teacher's ``output`` for it, from tape ``tape_id``."""

    node: str
    prompt: str
    output: str
    tape_id: str


def _rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _shape(output: str) -> str:
    """The kinds of an output's steps, in order (what kind of answer it is)."""
    try:
        return " ".join(str(step.get("kind")) for step in json.loads(output))
    except (ValueError, TypeError, AttributeError):
        return ""


def few_shot_demos(tapes: Iterable[Tape[Any, Any]], k: int, scan: int = 64) -> list[Demo]:
    """``k`` demos per student LLM node (``intent_discovery``, ``respond``) from prepared
    training ``tapes`` (see :func:`reusable`). ``student.reuse`` of the first ``scan`` tapes in
    the order of a hash of their ids gives the (prompt, output) pairs the student would be
    trained on; per node they are grouped by the answer's shape (its steps' kinds), and the
    demos are one pair from each of the ``k`` most common shapes (more rounds if there are
    fewer shapes than ``k``), the pair first in the order of a hash of its text, each from a
    different tape. Deterministic: the same tapes give the same demos."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k == 0:
        return []
    student = make_student(FunctionLLM(fn=lambda prompt: "[]"))
    chosen = sorted(tapes, key=lambda t: _rank(t.metadata.id))[:scan]
    pairs: dict[str, dict[tuple[str, str], str]] = {}
    for tape in chosen:
        reused, calls = student.reuse(tape)
        node_of = {s.metadata.prompt_id: s.metadata.node for s in reused.steps if s.metadata.prompt_id}
        for call in calls:
            node = node_of.get(call.prompt.id, "")
            key = (str(call.prompt.messages[-1]["content"]), call.output.content or "")
            pairs.setdefault(node, {}).setdefault(key, tape.metadata.id)
    demos: list[Demo] = []
    for node in ("intent_discovery", "respond"):
        shapes: dict[str, list[tuple[tuple[str, str], str]]] = {}
        for pair, tape_id in sorted(pairs.get(node, {}).items(), key=lambda kv: _rank("\n".join(kv[0]))):
            shapes.setdefault(_shape(pair[1]), []).append((pair, tape_id))
        queues = sorted(shapes.values(), key=len, reverse=True)  # the most common shapes first
        used: set[str] = set()
        picked = 0
        while picked < k and any(queues):
            for queue in queues:
                while queue and queue[0][1] in used:
                    queue.pop(0)
                if queue and picked < k:
                    (prompt, output), tape_id = queue.pop(0)
                    used.add(tape_id)
                    demos.append(Demo(node, prompt, output, tape_id))
                    picked += 1
    return demos


def demos_by_node(demos: Iterable[Demo]) -> dict[str, list[tuple[str, str]]]:
    """``make_student(..., demos=...)``'s argument: each node's (prompt, output) pairs."""
    out: dict[str, list[tuple[str, str]]] = {}
    for demo in demos:
        out.setdefault(demo.node, []).append((demo.prompt, demo.output))
    return out


def tokenizer_texts(tapes: list[Tape[Any, Any]], forms: FormSet) -> list[str]:
    """What the tiny tokenizer learns from: the student's prompts and outputs on the prepared
    tapes, and every company's forms as the student's prompt shows them."""
    student = make_student(FunctionLLM(fn=lambda prompt: "[]"))
    texts = ["system", "user", "assistant", *STUDENT_TEMPLATES.values()]
    for tape in tapes:
        _, calls = student.reuse(tape)
        for call in calls:
            texts += [m["content"] for m in call.prompt.messages] + [call.output.content or ""]
    for company in [*forms.train, *forms.test]:
        for form in company.forms:
            texts.append(turn_context(_with_schema(company, form.name)).form_compact)
    return texts


def _with_schema(company: Any, form: str) -> Tape[Any, Any]:
    env = FormFillerEnvironment(company)
    return Tape(steps=StepSequence([env.inspect(form)]))


@dataclass
class StudentConfig:
    """How the student is made and trained (``kind``: ``tiny`` or ``smollm2``)."""

    kind: str = "tiny"
    out: Path = Path("form-filler-out")
    steps: int = 300
    batch_size: int = 8
    learning_rate: float = 5e-3
    hidden: int = 128
    layers: int = 2
    vocab: int = 2048
    max_length: int = 512
    max_tokens: int = 200
    packing: bool = False
    seed: int = 0
    dtype: str = "float32"  # "auto": bf16 autocast on a CPU with bf16 instructions (AVX-512 BF16, AMX)


def tiny_student(config: StudentConfig, texts: list[str]) -> tuple[Any, Any, Path]:
    """A fresh tiny model and tokenizer (trained on ``texts``), saved under ``config.out``."""
    from tapekit.testing.tiny import TinyConfig, make_tiny

    path = config.out / "tiny-base"
    tiny = TinyConfig(
        vocab_size=config.vocab,
        hidden_size=config.hidden,
        num_layers=config.layers,
        num_heads=4,
        intermediate_size=3 * config.hidden,
        max_positions=config.max_length,
        seed=config.seed,
    )
    model, tokenizer = make_tiny(texts, tiny, path)
    return model, tokenizer, path


def train_student(config: StudentConfig, rows: Any, model: Any, tokenizer: Any) -> tuple[Path, float]:
    """SFT: full for the tiny model, LoRA for SmolLM2; returns the result's path and seconds."""
    from tapekit.training import LoraSettings, SFTConfig, train_sft

    lora = config.kind != "tiny"
    sft = SFTConfig(
        output_dir=str(config.out / f"sft-{config.kind}"),
        lora=LoraSettings(r=16, alpha=32) if lora else None,
        learning_rate=config.learning_rate,
        max_steps=config.steps,
        batch_size=config.batch_size,
        max_length=config.max_length,
        packing=config.packing,
        warmup_ratio=0.05,
        lr_scheduler="linear",
        logging_steps=max(1, config.steps // 10),
        device="cpu",
        dtype=config.dtype,  # type: ignore[arg-type]
        seed=config.seed,
    )
    started = time.perf_counter()
    final = train_sft(rows, model=model, tokenizer=tokenizer, config=sft)
    return final, time.perf_counter() - started


def student_llm(config: StudentConfig, model_path: str | None, adapter_path: str | None = None) -> Any:
    """The student's greedy LLM: the embedded SmolLM2 (``model_path`` None) decodes in llama.cpp,
    its LoRA adapter converted to GGUF (:func:`tapekit.llm.export_lora_gguf`), several times
    faster than transformers on a CPU; any other model through ``TransformersLLM``."""
    if model_path is None:
        from tapekit.llm import LlamaCppLLM, export_lora_gguf, smollm2_path

        lora = None
        if adapter_path is not None:
            lora = str(export_lora_gguf(adapter_path, smollm2_path(), Path(adapter_path) / "adapter.gguf"))
        return LlamaCppLLM(
            model_name=f"{config.kind}-student",
            lora_path=lora,
            parameters={"temperature": 0.0, "max_tokens": config.max_tokens},
        )
    from tapekit.llm import TransformersLLM

    return TransformersLLM(
        model_name=f"{config.kind}-student",
        model_path=model_path,
        adapter_path=adapter_path,
        device="cpu",
        max_tokens=config.max_tokens,
    )


def trainable(config: StudentConfig, model_path: str | None) -> tuple[Any, Any]:
    """The student's model and tokenizer for training, through transformers (the embedded
    SmolLM2 de-quantised from its GGUF: the weights llama.cpp decodes with)."""
    from tapekit.llm import TransformersLLM

    return TransformersLLM(model_name=f"{config.kind}-student", model_path=model_path).load()


def continue_branches(
    agent: Agent, branches: list[Branch], forms: FormSet, store: Any = None, name: str = "eval"
) -> list[Tape[Any, Any]]:
    """``agent``'s next turn on each branch's start (the dialogue up to the user's message),
    one batch per company; the tapes in the order of ``branches``."""
    out: dict[int, Tape[Any, Any]] = {}
    for company in sorted({b.company for b in branches}):
        indexed = [(i, b) for i, b in enumerate(branches) if b.company == company]
        results = batch(
            agent,
            FormFillerEnvironment(forms.company(company)),
            [b.start for _, b in indexed],
            store=store,
            name=f"{name}/{company}",
            max_loops=8,
            max_concurrency=4,
        )
        for (i, _), result in zip(indexed, results, strict=True):
            out[i] = result.tape
    return [out[i] for i in range(len(branches))]
