"""Generate the bundled mini corpus of examples/rag.py (deterministic: run it again and the
files come out byte-identical).

A HotPotQA-like world of made-up entities: each question needs two passages, the first about
the entity the question names (a bridge, a band, a novel) and the second about the person that
passage names (the bridge hop). Distractors share words with the questions: festivals named
like the entities, and many people described with the same words. Writes ``corpus.jsonl``
(``{"title", "text"}``) and ``questions.jsonl`` (``{"id", "question", "answer", "gold"}``,
``gold`` the titles of the two passages needed).

    python examples/data/rag/make_corpus.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SYLLABLES = "ka lo ren vi sa dor mel tu ba ri no ve sel ar ko mi tan da fel or lin zu pe gra hol".split()  # noqa: SIM905
INSTRUMENTS = [
    "cello",
    "oboe",
    "harp",
    "banjo",
    "trumpet",
    "viola",
    "flute",
    "accordion",
    "marimba",
    "bassoon",
]


def word(rng: random.Random, n: int = 2) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(n)).capitalize()


def unique(rng: random.Random, used: set[str], n: int = 2) -> str:
    while True:
        w = word(rng, n)
        if w not in used and len(w) > 3:
            used.add(w)
            return w


def main() -> None:
    rng = random.Random(20241)
    used: set[str] = set()
    corpus: list[dict[str, str]] = []
    questions: list[dict[str, object]] = []
    for i in range(72):
        kind = ("bridge", "band", "novel")[i % 3]
        entity = unique(rng, used)
        person = f"{unique(rng, used)} {unique(rng, used, 3)}"
        year = rng.randint(1850, 1990)
        if kind == "bridge":
            town = unique(rng, used)
            title_a = f"{entity} Bridge"
            text_a = (
                f"The {entity} Bridge is a stone arch bridge over a mountain gorge. It was designed by "
                f"the architect {person} and opened in {year}."
            )
            text_b = (
                f"{person} is an architect known for bridges and towers. "
                f"{person} was born in the town of {town}."
            )
            question = f"In which town was the architect of the {entity} Bridge born?"
            answer = town
        elif kind == "band":
            instrument = rng.choice(INSTRUMENTS)
            title_a = f"{entity} (band)"
            text_a = (
                f"{entity} is a folk band formed in {year}. The band was founded by the musician {person}."
            )
            text_b = f"{person} is a musician and songwriter. On stage, {person} plays the {instrument}."
            question = f"Which instrument does the founder of the band {entity} play?"
            answer = instrument
        else:
            river = unique(rng, used)
            title_a = f"{entity} (novel)"
            text_a = f"{entity} is a novel published in {year}. The novel was written by the author {person}."
            text_b = (
                f"{person} is an author of novels and essays. {person} lives in a city on the river {river}."
            )
            question = f"On which river is the city where the author of the novel {entity} lives?"
            answer = river
        corpus.append({"title": title_a, "text": text_a})
        corpus.append({"title": person, "text": text_b})
        festival = (
            f"The {entity} Festival is held every summer. "
            f"Visitors come for the music, the food and the old {kind}s."
        )
        corpus.append({"title": f"{entity} Festival", "text": festival})
        questions.append(
            {"id": f"q{i:03d}", "question": question, "answer": answer, "gold": [title_a, person]}
        )
    rng.shuffle(corpus)
    (HERE / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in corpus))
    (HERE / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
