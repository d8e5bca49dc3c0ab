"""Training samples from tapes: stored ids, multi-turn merge and breaks, per-node masks, the
template path, drift, fingerprints, determinism (the SmolLM2 tokenizer, no model weights run)."""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

import pytest

from tapekit import LLMCall, LLMOutput, Prompt, Tape
from tapekit.core import Action, Observation, StepMetadata
from tapekit.llm.base import TokenTrace
from tests.conftest import HAVE_LOCAL_MODEL

pytestmark = pytest.mark.skipif(
    not (HAVE_LOCAL_MODEL and all(importlib.util.find_spec(m) for m in ("transformers", "datasets", "gguf"))),
    reason="needs transformers, datasets, gguf and the embedded model's tokenizer (scripts/install-local.sh)",
)


class Say(Action):
    kind: Literal["test_samples_say"] = "test_samples_say"
    text: str


class Seen(Observation):
    kind: Literal["test_samples_seen"] = "test_samples_seen"
    text: str


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from tapekit.llm.llamacpp import smollm2_path

    path = smollm2_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _call(tok: Any, pid: str, messages: list[dict[str, Any]], answer: str, ids: bool = True) -> LLMCall:
    from tapekit.training._chat_tokenizer import ChatTokenizer

    chat = ChatTokenizer(tok)
    prompt_ids, output_ids = chat.render_call(messages, LLMOutput(content=answer))
    trace = (
        TokenTrace(
            prompt_ids=prompt_ids,
            output_ids=output_ids,
            output_logprobs=[-0.5] * len(output_ids),
            tokenizer=chat.fingerprint(),
            finish_reason="stop",
        )
        if ids
        else None
    )
    return LLMCall(prompt=Prompt(id=pid, messages=messages), output=LLMOutput(content=answer), tokens=trace)


def _tape(tok: Any, ids: bool = True, break_second: bool = False) -> tuple[Tape[Any, Any], list[LLMCall]]:
    """user -> plan (node 'plan') -> tool result -> act (node 'act'): two calls of agent 'a'."""
    m1 = [{"role": "user", "content": "Add 2 and 3."}]
    c1 = _call(tok, "p1", m1, "I will call add.", ids)
    m2 = [
        *m1,
        {"role": "assistant", "content": "I will call add." + (" " if break_second else "")},
        {"role": "user", "content": "[tool result] 5"},
    ]
    c2 = _call(tok, "p2", m2, "The answer is 5.", ids)
    steps = [
        Seen(text="Add 2 and 3."),
        Say(text="I will call add.", metadata=StepMetadata(prompt_id="p1", agent="a", node="plan")),
        Seen(text="5"),
        Say(text="The answer is 5.", metadata=StepMetadata(prompt_id="p2", agent="a", node="act")),
    ]
    return Tape(steps=steps, metadata={"result": {"score": 1.0}}), [c1, c2]


def test_merged_sample_is_exactly_the_stored_ids_with_loss_on_sampled_tokens(tokenizer: Any) -> None:
    from tapekit.training.samples import make_samples

    tape, calls = _tape(tokenizer)
    result = make_samples([tape], llm_calls=calls, tokenizer=tokenizer, reward="score")
    assert len(result.dataset) == 1 and not result.breaks
    row = result.dataset[0]
    second = calls[1].tokens
    assert second is not None and calls[0].tokens is not None
    assert row["input_ids"] == second.prompt_ids + second.output_ids  # the second prompt extends the first
    masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert masked == calls[0].tokens.output_ids + second.output_ids
    assert row["nodes"] == ["plan", "act"] and row["prompt_ids"] == ["p1", "p2"] and row["reward"] == 1.0
    assert row["source"] == "ids" and row["has_logprobs"]
    assert sorted(set(row["logprobs"])) == [-0.5, 0.0]


def test_per_node_samples_mask_the_other_nodes_tokens(tokenizer: Any) -> None:
    from tapekit.training.samples import make_samples

    tape, calls = _tape(tokenizer)
    row = make_samples([tape], llm_calls=calls, tokenizer=tokenizer, nodes=("act",)).dataset[0]
    masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert calls[1].tokens is not None and masked == calls[1].tokens.output_ids
    assert row["nodes"] == ["act"]


def test_a_prefix_break_starts_a_new_sample_and_is_reported(tokenizer: Any) -> None:
    from tapekit.training.samples import make_samples

    tape, calls = _tape(tokenizer, break_second=True)
    result = make_samples([tape], llm_calls=calls, tokenizer=tokenizer)
    assert len(result.dataset) == 2
    (brk,) = result.breaks
    assert brk.step_index == 3 and brk.node == "act" and brk.agent == "a"
    assert "does not start with" in brk.reason and "add." in brk.context


def test_template_path_without_ids_masks_only_the_answers(tokenizer: Any) -> None:
    from tapekit.training.samples import make_samples

    tape, calls = _tape(tokenizer, ids=False)
    row = make_samples([tape], llm_calls=calls, tokenizer=tokenizer).dataset[0]
    masked = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
    assert masked == "I will call add.<|im_end|>The answer is 5.<|im_end|>"
    assert row["source"] == "template" and not row["has_logprobs"]


def test_a_template_without_assistant_markers_is_an_error_naming_it(tokenizer: Any) -> None:
    import copy

    from tapekit.errors import TrainingError
    from tapekit.training.samples import make_samples

    plain = copy.copy(tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tape, calls = _tape(tokenizer, ids=False)
    with pytest.raises(TrainingError, match=r"chat template sha256:[0-9a-f]{12} has no assistant marker"):
        make_samples([tape], llm_calls=calls, tokenizer=plain)


def test_drift_report_catches_an_altered_template(tokenizer: Any) -> None:
    import copy

    from tapekit.training.samples import drift_report

    tape, calls = _tape(tokenizer)
    assert drift_report([tape], calls, tokenizer) == []
    altered = copy.copy(tokenizer)
    # a reworded default system prompt: the kind of change a template revision makes
    altered.chat_template = tokenizer.chat_template.replace(
        "AI assistant named SmolLM", "assistant called Smol"
    )
    assert altered.chat_template != tokenizer.chat_template
    drift = drift_report([tape], calls, altered)
    assert [d.step_index for d in drift] == [1, 3]
    assert "called" in drift[0].context and "named" in drift[0].context  # both texts around it


def test_ids_from_another_tokenizer_are_refused(tokenizer: Any) -> None:
    from tapekit.errors import TrainingError
    from tapekit.training.samples import make_samples

    tape, calls = _tape(tokenizer)
    assert calls[0].tokens is not None
    foreign = calls[0].tokens.model_copy(update={"tokenizer": "tk1-9-x"})
    calls[0] = calls[0].model_copy(update={"tokens": foreign})
    with pytest.raises(TrainingError, match=r"step 1 \(a\.plan\).*tokenizer tk1-9-x, not the training"):
        make_samples([tape], llm_calls=calls, tokenizer=tokenizer)


def test_same_tapes_give_byte_identical_files_with_a_content_hash(tokenizer: Any, tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    from tapekit.training.samples import iter_samples, make_samples

    tape, calls = _tape(tokenizer)
    a = make_samples([tape], llm_calls=calls, tokenizer=tokenizer)
    b = make_samples([tape], llm_calls=calls, tokenizer=tokenizer)
    assert a.content_hash == b.content_hash and a.content_hash.startswith("sha256:")
    for suffix in (".parquet", ".jsonl"):
        pa, pb = a.save(tmp_path / f"a{suffix}"), b.save(tmp_path / f"b{suffix}")
        assert pa.read_bytes() == pb.read_bytes()
    assert pq.read_schema(tmp_path / "a.parquet").metadata[b"tapekit.content_hash"] == a.content_hash.encode()
    assert list(iter_samples([tape], llm_calls=calls, tokenizer=tokenizer)) == a.dataset.to_list()
    c = make_samples([tape], llm_calls=calls, tokenizer=tokenizer, nodes=("act",))
    assert c.content_hash != a.content_hash


def test_reward_and_agent_filters(tokenizer: Any) -> None:
    from tapekit.errors import TrainingError
    from tapekit.training.samples import make_samples

    tape, calls = _tape(tokenizer)
    high = make_samples([tape], llm_calls=calls, tokenizer=tokenizer, reward="score", min_reward=2.0)
    assert len(high.dataset) == 0
    assert len(make_samples([tape], llm_calls=calls, tokenizer=tokenizer, agents=("b",)).dataset) == 0
    rows = make_samples([tape], llm_calls=calls, tokenizer=tokenizer, reward=lambda t: 0.5, min_reward=0.5)
    rows = rows.dataset
    assert rows[0]["reward"] == 0.5
    with pytest.raises(TrainingError, match=r"metadata\.result has no 'accuracy'"):
        make_samples([tape], llm_calls=calls, tokenizer=tokenizer, reward="accuracy")
    with pytest.raises(TrainingError, match=r"unknown sample options \['node'\]"):
        make_samples([tape], llm_calls=calls, tokenizer=tokenizer, node="act")


def test_streamed_rows_build_a_dataset(tokenizer: Any) -> None:
    from datasets import Dataset

    from tapekit.training.samples import iter_samples

    tape, calls = _tape(tokenizer, break_second=True)
    breaks: list[Any] = []
    streamed = Dataset.from_generator(
        lambda: iter_samples([tape], llm_calls=calls, tokenizer=tokenizer, breaks=breaks)
    )
    assert len(streamed) == 2 and streamed[0]["loss_mask"].count(1) > 0


def test_teacher_tapes_are_reused_by_the_student_and_rendered_with_its_template(tokenizer: Any) -> None:
    from collections.abc import Iterator

    from tapekit import Agent, FunctionLLM, Node
    from tapekit.training.samples import make_samples

    class Solve(Node):
        name: str = "solve"
        system: str = ""

        def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
            question = tape.steps[0]
            assert isinstance(question, Seen)
            return Prompt(
                messages=[
                    {"role": "system", "content": self.system},
                    {"role": "user", "content": question.text},
                ]
            )

        def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: Any) -> Iterator[Any]:
            yield Say(text=llm_stream.get_text())

        def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
            step = tape.steps[index]
            assert isinstance(step, Say)
            return LLMOutput(content=step.text)

    teacher_tape = Tape(
        steps=[
            Seen(text="2+2?"),
            Say(text="4", metadata=StepMetadata(prompt_id="t1", agent="teacher", node="solve", run_end=True)),
        ]
    )
    unused = FunctionLLM(fn=lambda prompt: "")  # reuse makes no call; the tokenizer is given
    student = Agent.create("student", llms=unused, nodes=[Solve(system="Be brief.")])
    result = make_samples([teacher_tape], reuse_with=student, tokenizer=tokenizer)
    (row,) = result.dataset.to_list()
    assert row["agent"] == "student" and row["source"] == "template" and row["nodes"] == ["solve"]
    text = tokenizer.decode(row["input_ids"])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n4<|im_end|>")
    masked = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
    assert masked == "4<|im_end|>"
