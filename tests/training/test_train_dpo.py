"""DPO from tapes: pairs cut where two attempts at one task diverge (prompt and completions
are the stored token ids), and DPO training that raises the chosen-over-rejected margin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from tapekit import Agent, AssistantThought, Node, Observation, Prompt, StopStep, Tape, ToolEnvironment
from tapekit.core import LLMOutput, SetNextNode
from tapekit.errors import TrainingError
from tapekit.evaluate import Score, Task, evaluate
from tapekit.llm.base import LLM, LLMEvent, TokenTrace
from tapekit.store import SQLiteStore
from tapekit.training.config import DPOConfig
from tapekit.training.dpo import PairSet, PreferencePair, diverging_pair, preference_pairs, train_dpo
from tests.training.train_helpers import chat, make_model


class DpoSum(Observation):
    kind: Literal["test_dpo.sum"] = "test_dpo.sum"
    a: int
    b: int


class Think(Node):
    name: str = "think"

    def make_prompt(self, agent: Any, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": "think"}])

    def generate_steps(self, agent: Any, tape: Tape[Any, Any], llm_stream: Any) -> Any:
        yield AssistantThought(content=llm_stream.get_text())
        yield SetNextNode(next_node="answer")


class Answer(Node):
    name: str = "answer"

    def make_prompt(self, agent: Any, tape: Tape[Any, Any]) -> Prompt:
        s = tape.steps[0]
        return Prompt(messages=[{"role": "user", "content": f"{s.a}+{s.b}"}])

    def generate_steps(self, agent: Any, tape: Tape[Any, Any], llm_stream: Any) -> Any:
        yield AssistantThought(content=llm_stream.get_text())
        yield StopStep()


class TokenLLM(LLM):
    """A backend that records token ids like a real one: the prompt rendered with the tiny
    tokenizer's chat template, the answer's ids with the end-of-turn token. The first ``wrong``
    answers to each sum are off by one; the thinking node always says "ok"."""

    model_name: str = "tiny-token"
    tokenizer: Any = None
    wrong: dict[tuple[int, int], int] = {}

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return self._answer(prompt)

    async def _answer(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        text = prompt.messages[-1]["content"]
        if text == "think":
            answer = "ok"
        else:
            a, b = map(int, text.split("+"))
            left = self.wrong.get((a, b), 0)
            self.wrong[(a, b)] = max(left - 1, 0)
            answer = str(a + b + (1 if left else 0))
        rendered = self.tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tokenize=False
        )
        ids = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        out = self.tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        trace = TokenTrace(prompt_ids=ids, output_ids=out, tokenizer="tiny")
        yield LLMEvent(
            output=LLMOutput(content=answer), tokens=trace, prompt_tokens=len(ids), output_tokens=len(out)
        )


def exact(tape: Tape[Any, Any], task: Task) -> Score:
    ok = tape.steps[-2].content == str(task.expected)
    return Score(value=float(ok), passed=ok)


def test_pairs_are_cut_where_the_attempts_diverge(tmp_path: Path) -> None:
    _, tok = make_model()
    llm = TokenLLM(tokenizer=tok, wrong={(1, 2): 1, (3, 4): 2, (5, 5): 3})
    agent = Agent.create("adder", llms=llm, nodes=[Think(), Answer()])
    tasks = [
        Task(id=f"{a}+{b}", start=Tape(steps=[DpoSum(a=a, b=b)]), expected=a + b)
        for a, b in [(1, 2), (3, 4), (5, 5), (2, 2)]
    ]
    with SQLiteStore(tmp_path / "t.db") as store:
        report = evaluate(agent, ToolEnvironment([]), tasks, exact, k=3, store=store, name="dpo")
        pairs = preference_pairs(report, store)
    # 1+2: 2 good x 1 bad; 3+4: 1 good x 2 bad; 5+5 all bad and 2+2 all good give no pair
    assert sorted(p.task_id for p in pairs.pairs) == ["1+2", "1+2", "3+4", "3+4"] and pairs.skipped == []
    prompt, _ = chat(1, 2)
    pair = next(p for p in pairs.pairs if p.task_id == "1+2")
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "1+2"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == prompt and pair.prompt_ids == tok(prompt, add_special_tokens=False)["input_ids"]
    assert tok.decode(pair.chosen_ids) == "3<|im_end|>" and tok.decode(pair.rejected_ids) == "4<|im_end|>"
    assert (pair.agent, pair.node, pair.step_index) == ("adder", "answer", 3)  # after the shared think run
    assert (pair.chosen_score, pair.rejected_score) == (1.0, 0.0)
    data = pairs.to_dataset()
    assert {"prompt_ids", "chosen_ids", "rejected_ids", "chosen_tape_id"} <= set(data.column_names)
    # a pair of identical attempts, or one without token ids, is skipped with the reason
    good = [s for s in report.samples if s.task_id == "2+2"]
    same = diverging_pair(report.tapes[good[0].tape_id], report.tapes[good[1].tape_id], {})
    assert isinstance(same, str) and "identical steps" in same
    bad = [s for s in report.samples if s.task_id == "3+4"]
    t_good = next(report.tapes[s.tape_id] for s in bad if s.scores["exact"].passed)
    t_bad = next(report.tapes[s.tape_id] for s in bad if not s.scores["exact"].passed)
    assert "no stored LLM call" in diverging_pair(t_good, t_bad, {})
    with pytest.raises(TrainingError, match="no preference pairs"):
        PairSet(skipped=["x"]).to_dataset()


def margin(model: Any, pairs: list[PreferencePair]) -> float:
    """Mean log p(chosen | prompt) - log p(rejected | prompt)."""

    def logp(prompt: list[int], completion: list[int]) -> float:
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1]
        return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).sum().item()

    return sum(logp(p.prompt_ids, p.chosen_ids) - logp(p.prompt_ids, p.rejected_ids) for p in pairs) / len(
        pairs
    )


def sum_pairs(tok: Any, n: int = 24) -> list[PreferencePair]:
    out = []
    for i in range(n):
        a, b = i % 12, (i // 12 + i) % 12
        prompt, _ = chat(a, b)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        good = tok(f"{a + b}<|im_end|>", add_special_tokens=False)["input_ids"]
        bad = tok(f"{a + b + 1}<|im_end|>", add_special_tokens=False)["input_ids"]
        out.append(PreferencePair(ids, good, bad, f"g{i}", f"b{i}", "adder", "answer", 0, 1.0, 0.0))
    return out


@pytest.mark.parametrize("lora", [False, True])
def test_dpo_raises_the_chosen_over_rejected_margin(tmp_path: Path, lora: bool) -> None:
    base = tmp_path / "base"
    model, tok = make_model(base)
    pairs = sum_pairs(tok)
    before = margin(model.eval(), pairs)
    config = DPOConfig(
        output_dir=str(tmp_path / "out"),
        lora={"r": 8, "alpha": 16} if lora else None,
        max_steps=16,
        batch_size=8,
        learning_rate=1e-2 if lora else 2e-3,
        warmup_ratio=0.2,
        beta=0.1,
        logging_steps=8,
        max_length=64,
        device="cpu",
    )
    result = train_dpo(PairSet(pairs=pairs).to_dataset(), str(base), config=config)
    if lora:
        from peft import PeftModel

        assert (result / "adapter_config.json").is_file()
        tuned = PeftModel.from_pretrained(make_model()[0], str(result)).eval()
    else:
        from transformers import AutoModelForCausalLM

        tuned = AutoModelForCausalLM.from_pretrained(result, local_files_only=True).eval()
    after = margin(tuned, pairs)
    assert after > before + 0.3, (before, after)


def test_dpo_input_errors_are_named(tmp_path: Path) -> None:
    model, tok = make_model()
    config = DPOConfig(output_dir=str(tmp_path), max_steps=1, device="cpu", max_length=8)
    with pytest.raises(TrainingError, match="lack columns"):
        train_dpo([{"prompt_ids": [1], "chosen_ids": [2]}], model, tokenizer=tok, config=config)
    with pytest.raises(TrainingError, match="more than max_length=8"):
        train_dpo(PairSet(pairs=sum_pairs(tok, 2)).to_dataset(), model, tokenizer=tok, config=config)


def test_dpo_a_tracker_not_installed_or_unknown_is_a_training_error_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.integrations.integration_utils as integrations

    import tapekit.training.dpo as dpo

    monkeypatch.setattr(integrations, "is_wandb_available", lambda: False)  # as if wandb were missing
    loaded: list[Any] = []
    load = dpo.load_model_and_tokenizer
    monkeypatch.setattr(dpo, "load_model_and_tokenizer", lambda *a: loaded.append(a) or load(*a))
    model, tok = make_model()
    pairs = PairSet(pairs=sum_pairs(tok, 2)).to_dataset()
    for report_to, message in (
        (["wandb"], r"report_to 'wandb' needs its package installed .*pip install wandb"),
        (["madeup"], "report_to: madeup is not supported"),
    ):
        config = DPOConfig(output_dir=str(tmp_path), max_steps=1, device="cpu", report_to=report_to)
        with pytest.raises(TrainingError, match=message):
            train_dpo(pairs, model, tokenizer=tok, config=config)
    assert loaded == [] and list(tmp_path.iterdir()) == []  # no model loaded, nothing written


def test_tapekit_train_dpo_cli(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tapekit.cli import app

    _, tok = make_model(tmp_path / "base")
    PairSet(pairs=sum_pairs(tok, 8)).to_dataset().to_json(str(tmp_path / "pairs.jsonl"))
    config = tmp_path / "dpo.json"
    config.write_text('{"model": "base", "dataset": "pairs.jsonl", "output_dir": "out", "device": "cpu"}')
    result = CliRunner().invoke(
        app, ["train", "dpo", str(config), "--max-steps", "2", "--set", "batch_size=4"]
    )
    assert result.exit_code == 0, result.output
    assert "step 2/2" in result.output and (tmp_path / "out" / "final" / "adapter_config.json").is_file()
    bad = CliRunner().invoke(app, ["train", "dpo", str(config), "--set", "beta=-1"])
    assert bad.exit_code == 2 and "beta" in bad.output
