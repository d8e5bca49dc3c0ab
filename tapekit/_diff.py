"""Readable comparisons of step sequences, shared by replay, reuse, resumption and training text."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from tapekit.core import Step


def signatures(steps: Iterable[Step]) -> list[dict[str, Any]]:
    """Steps as replay compares them: content, author and node, ids and timestamps left out.

    Prompt ids are renamed to their order of first appearance (``p0``, ``p1``, ...), so two
    tapes compare equal when their steps are grouped into node runs the same way, whatever
    the random ids are.
    """
    runs: dict[str, str] = {}
    out = []
    for step in steps:
        meta = step.metadata
        sig: dict[str, Any] = {"step": step.llm_dict(), "agent": meta.agent, "node": meta.node}
        if meta.prompt_id:
            sig["run"] = runs.setdefault(meta.prompt_id, f"p{len(runs)}")
        out.append(sig)
    return out


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first differing element, or None if the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def diff_text(
    expected: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]], labels: tuple[str, str]
) -> str:
    """A unified diff of two lists of step signatures, one JSON line per step."""

    def lines(items: Sequence[dict[str, Any]]) -> list[str]:
        return [f"[{i}] {json.dumps(x, sort_keys=True, ensure_ascii=False)}" for i, x in enumerate(items)]

    return "\n".join(difflib.unified_diff(lines(expected), lines(actual), *labels, lineterm="", n=1))
