"""How much of a form-filler run's users an LLM actually worded (``run.py --user-url``).

Reads a run's ``greadth.json`` and ``tapes.db`` and writes ``worded.json`` beside them:

- ``tree``: every LLM-played user step in the store (distinct step ids): how many carry the
  LLM's text and how many fell back to the program's (``facts["user_llm_fallback"]``, by reason);
- ``scored``: the scored turns' last user messages (the same partial dialogues for every agent):
  worded or fallen back, and of the worded ones that must give values (``facts["values"]`` or
  ``facts["invalid"]``), how many contain every value verbatim (the GREADTH rules trust the facts,
  so a worded message that drops a value makes them judge the assistant against something the
  user never said);
- ``greadth``: per agent, the turns and passing turns among the worded ones, the fallen-back ones
  and the *faithful* worded ones (those that state every value their facts give, or give none).

Usage: ``python scripts/form_filler_worded.py RUN_OUT [RUN_OUT ...]``
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def _facts(data: str) -> dict[str, Any]:
    return dict(json.loads(data).get("metadata", {}).get("other", {}).get("facts") or {})


def _given_values(facts: dict[str, Any]) -> list[str]:
    """The values a user step must state: its valid and invalid slot values."""
    given: list[str] = []
    for key in ("values", "invalid"):
        given += [str(v) for v in (facts.get(key) or {}).values()]
    return given


def worded_summary(out: Path) -> dict[str, Any]:
    """The summary described in the module docstring, for the run in ``out``."""
    report = json.loads((out / "greadth.json").read_text())
    db = sqlite3.connect(f"file:{out / 'tapes.db'}?mode=ro", uri=True)
    try:
        tree: Counter[str] = Counter()
        seen: set[str] = set()
        for step_id, data in db.execute("select step_id, data from steps where data like '%user_llm%'"):
            facts = _facts(data)
            if "user_llm" in facts and step_id not in seen:
                seen.add(step_id)
                tree[facts.get("user_llm_fallback") or "worded"] += 1

        def user_step(turn: dict[str, Any]) -> tuple[str, dict[str, Any]]:
            row = db.execute(
                "select data from steps where tape_id = ? and idx = ?", (turn["tape_id"], turn["user_index"])
            ).fetchone()
            if row is None:
                raise SystemExit(f"{out}: turn {turn['tape_id']}:{turn['user_index']} is not in tapes.db")
            return str(json.loads(row[0]).get("content", "")), _facts(row[0])

        greadth: dict[str, dict[str, Any]] = {}
        scored: dict[str, Any] = {}
        for agent, turns in report["turns"].items():
            # [turns, passing] by how the last user message was made
            counts = {"worded": [0, 0], "fallback": [0, 0], "worded_faithful": [0, 0]}
            for turn in turns:
                text, facts = user_step(turn)
                kind = "fallback" if "user_llm_fallback" in facts or "user_llm" not in facts else "worded"
                passed = turn["valid"] and all(f["passed"] for f in turn["findings"])
                kinds = [kind]
                if kind == "worded" and all(v.lower() in text.lower() for v in _given_values(facts)):
                    kinds.append("worded_faithful")  # states every value its facts give (or none)
                for k in kinds:
                    counts[k][0] += 1
                    counts[k][1] += int(passed)
            greadth[agent] = {k: {"turns": n, "passing": p} for k, (n, p) in counts.items()}
        first = next(iter(report["turns"].values()))
        steps = [user_step(t) for t in first]
        worded = [(text, f) for text, f in steps if "user_llm" in f and "user_llm_fallback" not in f]
        with_values = [(text, f) for text, f in worded if _given_values(f)]
        verbatim = [t for t, f in with_values if all(v.lower() in t.lower() for v in _given_values(f))]
        scored = {
            "turns": len(steps),
            "worded": len(worded),
            "fallback": len(steps) - len(worded),
            "worded_with_values": len(with_values),
            "worded_with_every_value_verbatim": len(verbatim),
        }
    finally:
        db.close()
    return {"tree": dict(tree), "scored": scored, "greadth": greadth}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for arg in argv:
        out = Path(arg)
        summary = worded_summary(out)
        (out / "worded.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"{out}: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
