"""``examples/form_filler/prompt_study.py``: the candidates are fixed, distinct and include the
baseline, and the choice rule. The study itself runs SmolLM2 for minutes:
docs/experiments/form-filler-prompts.md is its record."""

from __future__ import annotations

from examples.form_filler.prompt_study import BASELINE, CANDIDATES, batch_name, choose
from tapekit.batch._config import _NAME


def test_six_distinct_candidates_with_the_grammar_baseline_among_them() -> None:
    assert len(CANDIDATES) >= 6 and len(set(CANDIDATES.values())) == len(CANDIDATES)
    assert CANDIDATES[BASELINE] == (0, True)  # run.py's "zero-shot, grammar" student


def test_the_choice_is_the_most_passes_then_the_shorter_prompt_then_the_earlier() -> None:
    def row(passes: int, tokens: float) -> dict[str, float]:
        return {"passes": passes, "prompt_tokens_per_turn": tokens}

    assert choose({"a": row(3, 100), "b": row(5, 900), "c": row(4, 50)}) == "b"
    assert choose({"a": row(5, 300), "b": row(5, 200), "c": row(5, 250)}) == "b"
    assert choose({"a": row(5, 200), "b": row(5, 200)}) == "a"


def test_every_candidate_has_a_distinct_valid_batch_name() -> None:
    # the first run stopped at its third candidate: "grammar + 1 example" is no batch name
    names = {batch_name(split, c) for split in ("val", "fresh") for c in CANDIDATES}
    assert len(names) == 2 * len(CANDIDATES) and all(_NAME.match(n) for n in names)
    assert batch_name("val", "grammar + 1 example") == "prompt-val-grammar-1-example"
