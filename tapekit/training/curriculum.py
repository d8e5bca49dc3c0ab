"""Task samplers for on-policy RL over task categories: uniform, fixed order, and SEC.

Each RL step asks the sampler for ``n`` tasks (``sample(n)``), runs G rollouts of each, and
reports back each category's learning signal (``update(arm_rewards)``, usually
``RLStepStats.category_mean_abs_adv``: the mean absolute advantage of that category's groups).

- :class:`UniformSampler`: every task equally likely (``over="tasks"``), or every category
  (``over="categories"``); ignores the feedback. The baseline.
- :class:`FixedOrderSampler`: a hand-made curriculum, categories in the given order
  (easy -> hard), ``steps_per_category`` steps each, then the last one.
- :class:`SECSampler`: Self-Evolving Curriculum (arXiv:2505.14970). A non-stationary
  multi-armed bandit with one arm per category. The arm reward is the mean |advantage| of the
  category's groups in the step (a group whose rollouts all score alike teaches nothing), the
  value of each played arm follows TD(0), ``Q <- Q + alpha * (r - Q)``, and categories are drawn
  from the Boltzmann distribution ``p(c) = exp(Q(c) / tau) / sum_c' exp(Q(c') / tau)``.

Within a category, tasks come in a seeded shuffled order without replacement, reshuffled when
used up. Every sampler is seeded, logs its arm values and probabilities at every step (in
``history`` and to ``log_fn``), and round-trips its state through ``state_dict`` /
``load_state_dict`` (plain JSON) to resume a run exactly. Pure Python: no torch needed.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def boltzmann(values: Sequence[float], temperature: float) -> list[float]:
    """Softmax of ``values / temperature`` (computed stably); ``temperature`` must be > 0."""
    if temperature <= 0:
        raise ValueError(f"boltzmann: temperature must be > 0, got {temperature}")
    if not values:
        return []
    top = max(values)
    weights = [math.exp((v - top) / temperature) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


def td0_update(value: float, reward: float, alpha: float) -> float:
    """One TD(0) step toward ``reward``: ``value + alpha * (reward - value)``."""
    return value + alpha * (reward - value)


def _category_of(task: Any) -> str:
    category = getattr(task, "category", None)
    if category is None and isinstance(task, Mapping):
        category = task.get("category")
    if category is None:
        raise ValueError(f"task {task!r} has no category (give category_of= or tasks with .category)")
    return str(category)


class CategorySampler(ABC, Generic[T]):
    """Draws tasks for each RL step by category; subclasses choose the categories.

    ``tasks`` are grouped by ``category_of(task)`` (default: the task's ``category``, as on
    :class:`tapekit.evaluate.Task`). ``log_fn`` receives the step's record (step, categories
    drawn, arm values and probabilities) every time :meth:`sample` runs.
    """

    name = "base"

    def __init__(
        self,
        tasks: Sequence[T],
        *,
        seed: int = 0,
        category_of: Callable[[T], str] | None = None,
        log_fn: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if not tasks:
            raise ValueError(f"{type(self).__name__}: no tasks")
        of = category_of or _category_of
        self.tasks = list(tasks)
        self.by_category: dict[str, list[int]] = {}
        for i, task in enumerate(self.tasks):
            self.by_category.setdefault(of(task), []).append(i)
        self.categories = sorted(self.by_category)
        self.log_fn = log_fn
        self.rng = random.Random(seed)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self._queues: dict[str, list[int]] = {c: [] for c in self.categories}

    @abstractmethod
    def choose_categories(self, n: int) -> list[str]:
        """The categories of the next ``n`` tasks."""

    def probabilities(self) -> dict[str, float]:
        """The probability of drawing each category at the next step."""
        return {c: 1.0 / len(self.categories) for c in self.categories}

    def values(self) -> dict[str, float]:
        """The arm values (only SEC learns any; the others report 0.0)."""
        return {c: 0.0 for c in self.categories}

    def update(self, arm_rewards: Mapping[str, float]) -> None:
        """Feed back each played category's reward (mean |advantage|); a no-op here."""
        self._check_known(arm_rewards)

    def _check_known(self, arm_rewards: Mapping[str, float]) -> None:
        unknown = sorted(set(arm_rewards) - set(self.categories))
        if unknown:
            raise KeyError(
                f"{type(self).__name__}.update: unknown categories {unknown} (known: {self.categories})"
            )

    def _next_task(self, category: str, drawn: list[int]) -> int:
        """The next task of ``category``: each category's tasks in a shuffled round, a new round
        when one is used up. A round that starts mid-step puts the step's ``drawn`` tasks last,
        so a step draws a task twice only when its category has fewer tasks than the step's
        draws of it (two groups of one task in a step teach less than two tasks)."""
        queue = self._queues[category]
        if not queue:
            queue.extend(self.by_category[category])
            self.rng.shuffle(queue)
            queue.sort(key=lambda i: i not in drawn)  # stable; pop() takes from the end
        return queue.pop()

    def sample(self, n: int) -> list[T]:
        """``n`` tasks for the next step; logs the step's arm values and probabilities."""
        if n <= 0:
            raise ValueError(f"{type(self).__name__}.sample: n must be positive, got {n}")
        record: dict[str, Any] = {
            "step": self.step,
            "sampler": self.name,
            "values": self.values(),
            "probs": self.probabilities(),
        }
        chosen = self.choose_categories(n)
        picked: list[int] = []
        for category in chosen:
            picked.append(self._next_task(category, picked))
        record["counts"] = {c: chosen.count(c) for c in self.categories}
        self.history.append(record)
        if self.log_fn is not None:
            self.log_fn(record)
        self.step += 1
        return [self.tasks[i] for i in picked]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this sampler is (JSON-serialisable)."""
        version, internal, gauss = self.rng.getstate()
        return {
            "sampler": self.name,
            "categories": {c: len(self.by_category[c]) for c in self.categories},
            "step": self.step,
            "rng": [version, list(internal), gauss],
            "queues": {c: list(q) for c, q in self._queues.items()},
            "history": [dict(h) for h in self.history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` taken from a sampler of the same kind over the same tasks."""
        if state.get("sampler") != self.name:
            raise ValueError(f"{type(self).__name__}: the state is from a {state.get('sampler')!r} sampler")
        sizes = {c: len(self.by_category[c]) for c in self.categories}
        if state.get("categories") != sizes:
            raise ValueError(
                f"{type(self).__name__}: the state's categories {state.get('categories')} do not match "
                f"these tasks' {sizes}"
            )
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.step = int(state["step"])
        self._queues = {c: list(state["queues"][c]) for c in self.categories}
        self.history = [dict(h) for h in state["history"]]


class UniformSampler(CategorySampler[T]):
    """The baseline: tasks drawn uniformly (``over="tasks"``, so categories in proportion to
    their size) or categories drawn uniformly (``over="categories"``)."""

    name = "uniform"

    def __init__(self, tasks: Sequence[T], *, over: str = "tasks", **kwargs: Any) -> None:
        if over not in ("tasks", "categories"):
            raise ValueError(f"UniformSampler: over must be 'tasks' or 'categories', got {over!r}")
        super().__init__(tasks, **kwargs)
        self.over = over

    def probabilities(self) -> dict[str, float]:
        """Category sizes over the task count, or equal shares (``over="categories"``)."""
        if self.over == "categories":
            return super().probabilities()
        return {c: len(self.by_category[c]) / len(self.tasks) for c in self.categories}

    def choose_categories(self, n: int) -> list[str]:
        """``n`` independent draws from :meth:`probabilities`."""
        probs = self.probabilities()
        return self.rng.choices(self.categories, weights=[probs[c] for c in self.categories], k=n)


class FixedOrderSampler(CategorySampler[T]):
    """A fixed curriculum: ``order[0]`` for ``steps_per_category`` steps, then ``order[1]``, ...,
    staying on the last category once the order is used up."""

    name = "fixed"

    def __init__(
        self, tasks: Sequence[T], order: Sequence[str], *, steps_per_category: int, **kwargs: Any
    ) -> None:
        super().__init__(tasks, **kwargs)
        unknown = [c for c in order if c not in self.by_category]
        if not order:
            raise ValueError("FixedOrderSampler: the order is empty")
        if unknown:
            raise ValueError(
                f"FixedOrderSampler: the order names unknown categories {unknown} (known: {self.categories})"
            )
        if steps_per_category <= 0:
            raise ValueError(f"FixedOrderSampler: steps_per_category must be > 0, got {steps_per_category}")
        self.order = list(order)
        self.steps_per_category = steps_per_category

    def current(self) -> str:
        """The category of the current step."""
        return self.order[min(self.step // self.steps_per_category, len(self.order) - 1)]

    def probabilities(self) -> dict[str, float]:
        """1.0 for the current category, 0.0 for the others."""
        now = self.current()
        return {c: 1.0 if c == now else 0.0 for c in self.categories}

    def choose_categories(self, n: int) -> list[str]:
        """All ``n`` tasks from the current category."""
        return [self.current()] * n


class SECSampler(CategorySampler[T]):
    """Self-Evolving Curriculum: a Boltzmann policy over TD(0) values of the categories.

    ``alpha`` is the TD(0) step size (how fast old rewards are forgotten: the problem is
    non-stationary), ``temperature`` the Boltzmann temperature (high: close to uniform; low:
    greedy), ``initial_value`` every arm's starting value.
    """

    name = "sec"

    def __init__(
        self,
        tasks: Sequence[T],
        *,
        alpha: float = 0.5,
        temperature: float = 1.0,
        initial_value: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"SECSampler: alpha must be in (0, 1], got {alpha}")
        if temperature <= 0:
            raise ValueError(f"SECSampler: temperature must be > 0, got {temperature}")
        super().__init__(tasks, **kwargs)
        self.alpha = alpha
        self.temperature = temperature
        self.q: dict[str, float] = {c: float(initial_value) for c in self.categories}

    def values(self) -> dict[str, float]:
        """The arms' current TD(0) values."""
        return dict(self.q)

    def probabilities(self) -> dict[str, float]:
        """The Boltzmann distribution over the arm values."""
        probs = boltzmann([self.q[c] for c in self.categories], self.temperature)
        return dict(zip(self.categories, probs, strict=True))

    def choose_categories(self, n: int) -> list[str]:
        """``n`` independent draws from the Boltzmann distribution."""
        probs = self.probabilities()
        return self.rng.choices(self.categories, weights=[probs[c] for c in self.categories], k=n)

    def update(self, arm_rewards: Mapping[str, float]) -> None:
        """TD(0)-update the value of every category in ``arm_rewards`` (the played arms);
        the others keep theirs. Records the new values on the last history entry."""
        self._check_known(arm_rewards)
        for category, reward in arm_rewards.items():
            if not math.isfinite(reward):
                raise ValueError(f"SECSampler.update: reward of {category!r} is {reward}")
            self.q[category] = td0_update(self.q[category], float(reward), self.alpha)
        if self.history:
            self.history[-1]["arm_rewards"] = dict(arm_rewards)
            self.history[-1]["values_after"] = self.values()

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the arm values and hyper-parameters."""
        return {
            **super().state_dict(),
            "q": dict(self.q),
            "alpha": self.alpha,
            "temperature": self.temperature,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the base state and the arm values."""
        super().load_state_dict(state)
        self.q = {c: float(state["q"][c]) for c in self.categories}
