"""CachedLLM: a persistent cache keyed by the exact prompt and the wrapped model's settings."""

from __future__ import annotations

from pathlib import Path

from tapekit import FunctionLLM, Prompt
from tapekit.llm import CachedLLM, ScriptedLLM


def prompt(text: str) -> Prompt:
    return Prompt(messages=[{"role": "user", "content": text}])


def test_second_call_is_answered_from_the_cache(tmp_path: Path) -> None:
    inner = ScriptedLLM(outputs=["first answer", "second answer"])
    llm = CachedLLM(llm=inner, path=str(tmp_path / "cache.db"))
    assert llm.generate(prompt("q")).content == "first answer"
    assert llm.generate(prompt("q")).content == "first answer"  # not "second answer"
    assert (llm.hits, llm.misses, inner.n_calls) == (1, 1, 1)
    assert llm.generate(prompt("other")).content == "second answer"
    assert llm.model_name == "scripted"


def test_the_cache_survives_the_process_and_keys_on_settings(tmp_path: Path) -> None:
    path = str(tmp_path / "cache.db")
    CachedLLM(llm=ScriptedLLM(outputs=["remembered"]), path=path).generate(prompt("q"))
    inner = ScriptedLLM(outputs=["remembered"])  # the same model configuration, a new process
    fresh = CachedLLM(llm=inner, path=path)
    assert fresh.generate(prompt("q")).content == "remembered" and fresh.hits == 1 and inner.n_calls == 0
    changed_inner = ScriptedLLM(outputs=["remembered"], latency_s=0.001)  # a different setting
    changed = CachedLLM(llm=changed_inner, path=path)
    assert changed.generate(prompt("q")).content == "remembered"
    assert changed.misses == 1 and changed_inner.n_calls == 1


def test_streaming_passes_through_on_a_miss(tmp_path: Path) -> None:
    llm = CachedLLM(llm=FunctionLLM(fn=lambda p: "a b c"), path=str(tmp_path / "c.db"))
    events = list(llm.stream(prompt("x")))
    assert [e.chunk for e in events if e.chunk] == ["a ", "b ", "c"]
    assert events[-1].output is not None and events[-1].output.content == "a b c"
