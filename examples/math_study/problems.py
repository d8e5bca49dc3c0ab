"""Arithmetic word problems in difficulty levels, generated deterministically from a seed.

A problem starts with a quantity and applies one to three operations to it, left to right
("Ann has 12 apples. She buys 7 more. Then she gives away 5."). Its plan is the arithmetic
expression with the parentheses that order needs, and its answer a non-negative integer.

- ``level1``: one operation (+ or -), numbers up to 30;
- ``level2``: two operations (+, -, and x2..x5), numbers up to 40;
- ``level3``: three operations (+, -, x2..x5, and exact division), numbers up to 50;
- ``level4`` and ``level5`` (:data:`HARDER`, only when asked for): four and five operations of
  the same kinds, numbers up to 60: longer than anything the default pipeline teaches, a pool's
  hard tail for the RL stage's curriculum.

The level is the problem's category. :func:`difficulty` grades finer, by level and by the size
of the numbers met on the way (the RL stage's curriculum can sample by either).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "ALL_LEVELS",
    "DIFFICULTIES",
    "HARDER",
    "LEVELS",
    "Operation",
    "Problem",
    "difficulty",
    "format_expression",
    "make_problems",
    "split_problems",
]

LEVELS: dict[str, int] = {"level1": 1, "level2": 2, "level3": 3}  # category -> number of operations
HARDER: dict[str, int] = {"level4": 4, "level5": 5}  # generated only when asked for by name
ALL_LEVELS: dict[str, int] = LEVELS | HARDER  # every level, easiest first
LIMITS: dict[int, int] = {1: 30, 2: 40, 3: 50, 4: 60, 5: 60}  # level -> largest start and added number

NAMES = ["Ann", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jon", "Kai", "Lea", "Max", "Nia"]
PRONOUNS = {"Ann": "She", "Cleo": "She", "Eva": "She", "Gia": "She", "Ivy": "She", "Lea": "She", "Nia": "She"}
ITEMS = ["apples", "books", "coins", "pens", "stamps", "cards", "shells", "marbles", "stickers", "cookies"]
MULTIPLIERS = {2: "doubles", 3: "triples", 4: "multiplies by 4", 5: "multiplies by 5"}
LARGE = 100  # a problem that meets a number this large (or larger) is graded "-large"
# the grades of difficulty(), easiest first (level1 stays below LARGE: 30 + 30 at most)
DIFFICULTIES = ["level1", "level2-small", "level2-large", "level3-small", "level3-large"]


@dataclass(frozen=True)
class Operation:
    """One operation applied to the running quantity: ``op`` is one of + - * / and
    ``operand`` the other number."""

    op: str
    operand: int


@dataclass(frozen=True)
class Problem:
    """A word problem: ``question`` (the text), ``start`` and ``operations`` (its meaning),
    ``expression`` (the plan, e.g. ``(12+7)*3-5``), ``answer`` and ``category`` (level)."""

    id: str
    category: str
    question: str
    start: int
    operations: tuple[Operation, ...]
    expression: str
    answer: int

    def steps(self) -> list[tuple[int, str, int, int]]:
        """The calculator steps ``(left, op, right, result)``, each using the previous result."""
        out, value = [], self.start
        for operation in self.operations:
            result = apply(value, operation)
            out.append((value, operation.op, operation.operand, result))
            value = result
        return out


def difficulty(problem: Problem) -> str:
    """A finer grade than the level: ``level2-large`` when a number of the problem (the start,
    an operand or a result on the way) is ``LARGE`` or more, else ``level2-small``; ``level1``
    (whose numbers stay below ``LARGE``) and the :data:`HARDER` levels (which the students
    almost never solve, at any size) as they are. Measured on the tiny SFT students, a number
    of 100 or more is what most separates the problems they solve from those they never do,
    within a level."""
    if problem.category not in ("level2", "level3"):
        return problem.category
    largest = max(max(left, right, result) for left, _, right, result in problem.steps())
    return f"{problem.category}-{'large' if largest >= LARGE else 'small'}"


def apply(value: int, operation: Operation) -> int:
    """``value op operand`` (division is exact by construction)."""
    if operation.op == "+":
        return value + operation.operand
    if operation.op == "-":
        return value - operation.operand
    if operation.op == "*":
        return value * operation.operand
    if operation.op == "/":
        if value % operation.operand:
            raise ValueError(f"{value}/{operation.operand} is not exact")
        return value // operation.operand
    raise ValueError(f"unknown operation {operation.op!r}")


def format_expression(start: int, operations: tuple[Operation, ...]) -> str:
    """The expression that applies ``operations`` to ``start`` left to right, with
    parentheses only where precedence needs them: ``(12+7)*3-5``."""
    text, additive = str(start), False
    for operation in operations:
        if operation.op in "*/" and additive:
            text = f"({text})"
        text += f"{operation.op}{operation.operand}"
        additive = operation.op in "+-"
    return text


def _sentence(operation: Operation, pronoun: str, item: str) -> str:
    if operation.op == "+":
        verb = ["buys", "finds", "gets"][operation.operand % 3]
        return f"{pronoun} {verb} {operation.operand} more."
    if operation.op == "-":
        verb = ["gives away", "loses", "sells"][operation.operand % 3]
        return f"{pronoun} {verb} {operation.operand}."
    if operation.op == "*":
        return f"The number of {item} {MULTIPLIERS[operation.operand]}."
    return f"{pronoun} splits them into {operation.operand} equal groups and keeps one group."


def _operation(rng: random.Random, value: int, level: int, allowed: str) -> Operation:
    limit = LIMITS[level]
    choices = [op for op in allowed if op != "-" or value > 1]
    divisors = [d for d in (2, 3, 4, 5) if value % d == 0 and value // d > 0]
    if "/" in choices and not divisors:
        choices.remove("/")
    if "*" in choices and value > 200:
        choices.remove("*")
    op = rng.choice(choices)
    if op == "+":
        return Operation("+", rng.randint(2, limit))
    if op == "-":
        return Operation("-", rng.randint(1, value - 1))
    if op == "*":
        return Operation("*", rng.randint(2, 5))
    return Operation("/", rng.choice(divisors))


def make_problem(rng: random.Random, category: str, index: int) -> Problem:
    """One problem of ``category`` drawn from ``rng``."""
    if category not in ALL_LEVELS:
        raise ValueError(f"unknown problem category {category!r}; choose from {sorted(ALL_LEVELS)}")
    level = ALL_LEVELS[category]
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    pronoun = PRONOUNS.get(name, "He")
    start = rng.randint(2, LIMITS[level])
    allowed = {1: "+-", 2: "+-*"}.get(level, "+-*/")
    operations: list[Operation] = []
    value = start
    for _ in range(level):
        operation = _operation(rng, value, level, allowed)
        operations.append(operation)
        value = apply(value, operation)
    sentences = [f"{name} has {start} {item}."]
    sentences += [_sentence(o, pronoun, item) for o in operations]
    sentences.append(f"How many {item} does {name} have now?")
    ops = tuple(operations)
    return Problem(
        id=f"{category}-{index}",
        category=category,
        question=" ".join(sentences),
        start=start,
        operations=ops,
        expression=format_expression(start, ops),
        answer=value,
    )


def make_problems(n: int, seed: int = 0, categories: list[str] | None = None) -> list[Problem]:
    """``n`` problems, spread evenly over ``categories`` (default: every level), the same for
    the same ``n``, ``seed`` and categories; no two share a question."""
    if n < 0:
        raise ValueError(f"make_problems: n must be >= 0, got {n}")
    categories = categories or list(LEVELS)
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 50 * n + 100:
            raise ValueError(f"make_problems could not find {n} distinct problems")
        category = categories[len(problems) % len(categories)]
        problem = make_problem(rng, category, len(problems))
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems


def split_problems(
    n_train: int,
    n_heldout: int,
    seed: int = 0,
    train_weights: dict[str, int] | None = None,
    categories: list[str] | None = None,
) -> tuple[list[Problem], list[Problem]]:
    """Disjoint training and held-out problems (held-out ids start with ``heldout-``), both
    spread evenly over ``categories`` (default: the three :data:`LEVELS`; e.g. add ``level4``
    and ``level5`` for a hard tail). ``train_weights`` (e.g. ``{"level1": 1, "level2": 2,
    "level3": 3}``) draws the training problems in those proportions instead, from another
    stream, leaving out any question that is held out."""
    everything = make_problems(n_train + n_heldout, seed, categories)
    train = everything[:n_train]
    if train_weights is not None:
        unknown = set(train_weights) - set(LEVELS)
        if unknown or not any(train_weights.values()) or min(train_weights.values()) < 0:
            raise ValueError(
                f"train_weights must give levels {sorted(LEVELS)} counts >= 0, got {train_weights}"
            )
        categories = [c for c in LEVELS for _ in range(train_weights.get(c, 0))]
        held = {p.question for p in everything[n_train:]}
        pool = make_problems(n_train + n_heldout, seed + 7919, categories)
        train = [p for p in pool if p.question not in held][:n_train]
    heldout = [
        Problem(
            id=f"heldout-{p.id}",
            category=p.category,
            question=p.question,
            start=p.start,
            operations=p.operations,
            expression=p.expression,
            answer=p.answer,
        )
        for p in everything[n_train:]
    ]
    return train, heldout
