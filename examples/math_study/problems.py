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
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import islice

__all__ = [
    "ALL_LEVELS",
    "DIFFICULTIES",
    "HARDER",
    "LEVELS",
    "TEST_STREAM",
    "Operation",
    "Problem",
    "Splits",
    "arithmetic",
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


def _stream(seed: int, categories: list[str]) -> Iterator[Problem]:
    """The problems of ``seed``, the categories in turn, no question twice (endless)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    attempts = 0
    while True:
        attempts += 1
        if attempts > 50 * len(seen) + 150:
            raise ValueError(f"could not find more than {len(seen)} distinct problems")
        category = categories[len(seen) % len(categories)]
        problem = make_problem(rng, category, len(seen))
        if problem.question not in seen:
            seen.add(problem.question)
            yield problem


def make_problems(n: int, seed: int = 0, categories: list[str] | None = None) -> list[Problem]:
    """``n`` problems, spread evenly over ``categories`` (default: every level), the same for
    the same ``n``, ``seed`` and categories (a shorter list is a prefix of a longer one); no
    two share a question."""
    if n < 0:
        raise ValueError(f"make_problems: n must be >= 0, got {n}")
    return list(islice(_stream(seed, categories or list(LEVELS)), n))


def arithmetic(problem: Problem) -> str:
    """What decides a problem's answer: its start and its operations in order, written as
    :func:`format_expression` writes them (``(12+7)*3-5``). Two problems with the same
    arithmetic differ only in names and items; a validation or test problem must not share it
    with a problem trained (or, for test, chosen) on."""
    return format_expression(problem.start, problem.operations)


TEST_STREAM = 104_729  # the test problems come from seed + TEST_STREAM, a stream no other set draws from


@dataclass(frozen=True)
class Splits:
    """Training, validation and test problems (see :func:`split_problems`); unpacks as
    ``train, val, test``. ``dropped`` counts, per split and category, the candidates skipped
    because their arithmetic was already used."""

    train: list[Problem]
    val: list[Problem]
    test: list[Problem]
    dropped: dict[str, Counter[str]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[list[Problem]]:
        return iter((self.train, self.val, self.test))


def _renamed(problem: Problem, prefix: str) -> Problem:
    return replace(problem, id=f"{prefix}-{problem.id}")


def _draw(
    stream: Iterator[Problem], quota: Counter[str], used: set[str], prefix: str, limit: int
) -> tuple[list[Problem], Counter[str]]:
    """The first problems of ``stream`` that fill ``quota`` (count per category) and whose
    arithmetic is neither in ``used`` nor an earlier pick's, in stream order, ids prefixed
    ``prefix-``; and how many were skipped per category because their arithmetic was taken."""
    out: list[Problem] = []
    wanted, dropped, used = Counter(quota), Counter[str](), set(used)
    for looked in range(limit + 1):
        if sum(wanted.values()) == 0:
            return out, dropped
        if looked == limit:
            short = {c: n for c, n in wanted.items() if n}
            raise ValueError(
                f"split_problems: after {limit} candidates still short of {short} {prefix} problems "
                "whose arithmetic is not already used; ask for fewer"
            )
        problem = next(stream)
        if wanted[problem.category] == 0:
            continue
        if arithmetic(problem) in used:
            dropped[problem.category] += 1
            continue
        wanted[problem.category] -= 1
        used.add(arithmetic(problem))
        out.append(_renamed(problem, prefix))
    return out, dropped


def split_problems(
    n_train: int,
    n_val: int,
    n_test: int = 0,
    seed: int = 0,
    train_weights: dict[str, int] | None = None,
    categories: list[str] | None = None,
    test_avoids: Iterable[Problem] = (),
) -> Splits:
    """Training, validation and test problems, fixed by the arguments, disjoint by question and
    by :func:`arithmetic`.

    - ``train``: the first ``n_train`` problems of the seed's stream, spread evenly over
      ``categories`` (default: the three :data:`LEVELS`; e.g. add ``level4`` and ``level5``
      for a hard tail), or, with ``train_weights`` (e.g. ``{"level1": 1, "level2": 2,
      "level3": 3}``), of another stream drawn in those proportions. Everything the example
      trains on (the SFT teacher tapes, the RL stage's pool) comes from these.
    - ``val`` (ids ``val-...``): the problems that follow the first ``n_train`` of the seed's
      stream (the held-out problems every tuning round so far was measured on), as many per
      category as those ``n_val`` positions hold, skipping any whose arithmetic is a training
      problem's (or an earlier validation problem's) and taking the next ones instead. Every
      choice of settings is made here.
    - ``test`` (ids ``test-...``): ``n_test`` problems of a stream of their own
      (``seed + TEST_STREAM``), spread evenly over ``categories``, skipping any whose
      arithmetic is a training, validation or earlier test problem's. Measured once, on the
      final settings. ``test_avoids``: more problems whose arithmetic no test problem may
      repeat (e.g. another stage's training set, drawn with other arguments).

    With few possible arithmetics (``level1``: 1,276) a large training set leaves few for the
    other splits; a ValueError says so when a split cannot be filled.
    """
    if min(n_train, n_val, n_test) < 0:
        raise ValueError(f"split_problems: sizes must be >= 0, got {n_train}, {n_val}, {n_test}")
    categories = categories or list(LEVELS)
    main = _stream(seed, categories)
    train = list(islice(main, n_train))  # the validation problems follow these in the stream
    if train_weights is not None:
        unknown = set(train_weights) - set(LEVELS)
        if unknown or not any(train_weights.values()) or min(train_weights.values()) < 0:
            raise ValueError(
                f"train_weights must give levels {sorted(LEVELS)} counts >= 0, got {train_weights}"
            )
        weighted = [c for c in LEVELS for _ in range(train_weights.get(c, 0))]
        train = make_problems(n_train, seed + 7919, weighted)
    used = {arithmetic(p) for p in train}
    # the validation window: the categories of stream positions n_train .. n_train + n_val - 1
    window = Counter(categories[(n_train + j) % len(categories)] for j in range(n_val))
    val, val_dropped = _draw(main, window, used, "val", limit=200 * n_val + 20_000)
    used |= {arithmetic(p) for p in val} | {arithmetic(p) for p in test_avoids}
    even = Counter({c: n_test // len(categories) for c in categories})
    even.update(categories[: n_test % len(categories)])
    test_stream = _stream(seed + TEST_STREAM, categories)
    test, test_dropped = _draw(test_stream, even, used, "test", limit=200 * n_test + 20_000)
    return Splits(train, val, test, {"val": val_dropped, "test": test_dropped})
