"""Many made-up training companies, for a student that must learn to copy names, not remember them.

The bundled form set has 3 training companies (30 forms): a small student trained on their
dialogues memorises those forms' names and writes them on the test companies' forms.
:func:`synthetic_companies` builds any number of further *training* companies whose forms have
random names, slots, options and examples drawn from word lists (with the same structure as the
bundled forms: a categorical, a free-text and a date slot, an email, optional notes, sometimes
an urgency; see :func:`~examples.form_filler.make_forms.build_form`), so the only way to write a
correct answer is to read the names from the prompt. The same ``n`` and ``seed`` always give the
same companies; names that a test company uses for a form are never drawn.
"""

from __future__ import annotations

import random

from examples.form_filler.make_forms import FormSpec, build_form
from examples.form_filler.schema import Company, FormSet, check_form_set

__all__ = ["synthetic_companies"]


def _words(text: str) -> list[str]:
    return text.split()


_VERBS = _words(
    "book request order report register renew cancel update submit schedule claim reserve approve "
    "transfer return replace extend reset open close record assign log apply file"
)
_NOUNS = _words(
    "badge laptop locker parcel permit visa pass shift desk room vehicle license refund invoice "
    "ticket budget grant course exam review audit sample delivery pallet crate meter "
    "voucher stipend bonus trip seminar workshop cable printer monitor sensor pump valve filter "
    "kiosk uniform helmet tablet phone router server backup account mailbox folder contract "
    "lease deposit pension benefit coupon garden boat drone bike scooter trailer canteen "
    "battery antenna engine harbour warehouse studio camera poster banner keycard"
)
_ADJECTIVES = _words(
    "annual weekly spare remote mobile shared temporary private guest external internal "
    "night weekend urgent bulk custom digital paper small large green blue silver golden "
    "junior senior regional local"
)
_VALUES = _words(
    "basic plus premium standard express economy deluxe compact full partial single double "
    "monthly quarterly yearly north south east west morning evening red amber green online "
    "onsite phone letter card cash points low medium high small large tiny huge bronze silver "
    "gold platinum alpha beta gamma delta manual automatic indoor outdoor short long"
)
_GLOSSES = (
    "the usual case",
    "the cheapest option",
    "the fastest option",
    "most people",
    "approved requests only",
    "teams",
    "visitors",
    "requests handled by hand",
    "anything else",
    "long requests",
    "short requests",
    "extra checks",
)
_FIRST = _words("Dana Omar Priya Lena Hugo Mira Tariq Ines Noah Yuki Aron Sofia Kemal Rosa Ivan")
_PLACES = _words("Leeds Porto Kyoto Lagos Quito Oslo Perth Lima Riga Turin Dakar Hanoi Bergen Cork")
_DAYS = "day of the request", "start date", "day it is needed", "due date", "day of the visit"


def _camel(*words: str) -> str:
    return "".join(w.capitalize() for w in words)


def _example(rng: random.Random, kind: int) -> str:
    """A free-text example: a code, a name, a place or a number-like reference."""
    if kind == 0:
        letters = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(2))
        return f"{letters}{rng.randrange(1000, 99999)}"
    if kind == 1:
        return f"{rng.choice(_FIRST)} {rng.choice(_FIRST)}son"
    if kind == 2:
        return f"{rng.choice(_PLACES)} {rng.choice(_NOUNS)}"
    return f"{rng.choice(_NOUNS)}-{rng.randrange(10, 999)}"


def _spec(rng: random.Random, taken: set[str]) -> FormSpec:
    """One random form spec whose name is not in ``taken`` (and is added to it)."""
    while True:
        verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
        adjective = rng.choice(_ADJECTIVES) if rng.random() < 0.5 else ""
        name = _camel(verb, *([adjective] if adjective else []), noun)
        if name not in taken:
            taken.add(name)
            break
    thing = f"{adjective} {noun}".strip()
    cat_noun, text_noun, date_noun = rng.sample(_NOUNS, 3)
    cat_slot = f"{cat_noun}_{rng.choice(['type', 'level', 'plan', 'option', 'kind', 'tier'])}"
    text_slot = f"{text_noun}_{rng.choice(['name', 'code', 'reference', 'number', 'location', 'label'])}"
    date_slot = f"{date_noun}_date"
    values = rng.sample(_VALUES, rng.choice([2, 3, 3, 4]))
    choices = [(v, rng.choice(_GLOSSES)) for v in values]
    default = rng.choice(values) if rng.random() < 0.4 else None
    kind = rng.randrange(4)
    return FormSpec(
        name=name,
        purpose=f"{verb} a {thing}",
        team=f"the {_camel(rng.choice(_ADJECTIVES), rng.choice(_NOUNS))} team",
        days=rng.randrange(1, 6),
        choice=(cat_slot, f"the {cat_slot.replace('_', ' ')}", choices, default),
        text=(text_slot, f"the {text_slot.replace('_', ' ')}", [_example(rng, kind), _example(rng, kind)]),
        when=(date_slot, f"the {rng.choice(_DAYS)}"),
    )


def synthetic_companies(
    n: int, seed: int = 0, avoid: FormSet | None = None, forms: int = 10
) -> list[Company]:
    """``n`` made-up training companies of ``forms`` random forms each, deterministically from
    ``seed``; no form is named like a form of ``avoid`` (the bundled set, say). ``ValueError``
    if ``n`` or ``forms`` is negative or a generated company is invalid."""
    if n < 0 or forms < 1:
        raise ValueError(f"synthetic_companies: n must be >= 0 and forms >= 1, got n={n}, forms={forms}")
    rng = random.Random(f"synthetic:{seed}")
    taken = {f.name for c in [*avoid.train, *avoid.test] for f in c.forms} if avoid else set()
    companies = []
    for i in range(n):
        name = f"{_camel(rng.choice(_ADJECTIVES), rng.choice(_NOUNS))}Co{i}"
        domain = f"{name.lower()}.example"
        specs = [_spec(rng, taken) for _ in range(forms)]
        schemas = [build_form(spec, name, domain, rng) for spec in specs]
        companies.append(Company(name=name, description=f"{name} is a made-up company.", forms=schemas))
    problems = check_form_set(FormSet(train=companies, test=[]), forms_per_company=forms, all_kinds=True)
    if problems:
        raise ValueError("synthetic companies are invalid: " + "; ".join(problems[:3]))
    return companies
