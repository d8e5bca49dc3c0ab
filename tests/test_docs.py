"""Every Python snippet in the guides runs as written (each file's blocks in order)."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.scripted_openai import scripted_openai_server

DOCS = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))


@pytest.fixture(scope="module")
def llm_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The scripted OpenAI-compatible server that the guides' "your own model" snippets talk to."""
    with scripted_openai_server(api_key="sk-docs-test") as served:
        yield served


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_guide_snippets_run(
    path: Path, llm_server: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a user sets in their shell: the server's URL and the key (the server checks it)
    monkeypatch.setenv("LLM_BASE_URL", llm_server[0])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-docs-test")
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert blocks, f"{path.name} has no Python examples"
    # a real module, as a user's script would be: pydantic looks classes' modules up
    module = types.ModuleType(f"tapekit_docs_{path.stem}")
    sys.modules[module.__name__] = module
    try:
        exec(compile("\n".join(blocks), str(path), "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[module.__name__]


def test_the_quickstart_talks_to_the_server_with_the_key_from_the_environment(
    llm_server: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quickstart's agent reaches the model over HTTP, offers the tool, and sends the key."""
    before = len(llm_server[1])
    test_guide_snippets_run(
        Path(__file__).resolve().parent.parent / "docs" / "quickstart.md", llm_server, monkeypatch
    )
    requests = llm_server[1][before:]
    assert [r["model"] for r in requests] == ["qwen2.5-7b-instruct"] * 3  # hello, tool call, answer
    assert requests[1]["tools"][0]["function"]["name"] == "get_order_status"
    assert requests[2]["messages"][-1]["role"] == "tool"
