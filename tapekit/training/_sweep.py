"""Sweeps: many short runs over hyperparameter configurations, each run one row of a JSONL file.

A *space* is ``{hyperparameter: [values]}``; :func:`config_grid` is its full factorial and
:func:`sample_configs` a seeded sample of it (the way a study samples configurations when the
grid is too large to run; ``balanced=True``: a Latin-hypercube design, each value of each
hyperparameter in as many configurations as the others). :func:`run_sweep` calls
``run(config, seed)`` for every (configuration, training seed) that the results file does not
hold yet and appends one :class:`SweepRow` per run; :func:`read_sweep` reads the file back, and
:func:`tapekit.evaluate.bootstrap_configs` says which settings matter.

**Order.** Seed-major: every configuration with the first seed, then every one with the
second, and so on, so a sweep stopped early has as many configurations covered as it can.
:func:`config_grid` varies the last hyperparameter fastest, values in the order given.

**Durability.** Each row is one JSON line written with a single ``write`` on a file opened
for appending, then flushed to disk (``fsync``), before the next run starts: a killed sweep
loses at most the run in progress, and calling :func:`run_sweep` again with the same
arguments runs only what is missing. A last line without its newline is what a kill during
the write leaves: it is cut off (the run is done again) and a warning logged; a malformed line
anywhere else is an error. One process writes a results file at a time.

**Failures.** A run that raises is recorded with its error (``"TypeName: message"``) and the
sweep goes on. The next call skips it like a finished run unless ``retry_failed=True``; a
retried run appends a new row, and :func:`read_sweep` keeps each run's last row.

**Values.** A hyperparameter's value is a JSON scalar (str, int, float, bool or None), so a row
reads back equal to what was written; two configurations are the same when their canonical
JSON is (``1`` and ``1.0`` differ).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tapekit.evaluate._configs import ConfigValue, check_config_value, config_key

logger = logging.getLogger(__name__)

Space = Mapping[str, Sequence[ConfigValue]]


class SweepRow(BaseModel):
    """One run of a sweep: its configuration and training seed, the metrics ``run`` returned
    (empty when it raised), the seconds it took, and its error (``None`` when it finished)."""

    model_config = ConfigDict(frozen=True)

    config: dict[str, ConfigValue]
    seed: int
    metrics: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        """The run's identity: (canonical JSON of the configuration, seed)."""
        return config_key(self.config), self.seed


# --------------------------------------------------------------------------- configurations


def _check_space(space: Space) -> list[tuple[str, list[ConfigValue]]]:
    if not isinstance(space, Mapping):
        raise ValueError(f"space must be a mapping {{hyperparameter: [values]}}, got {type(space).__name__}")
    if not space:
        raise ValueError("space is empty: give at least one hyperparameter and its values")
    checked = []
    for name, values in space.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"space: a hyperparameter's name must be a non-empty str, got {name!r}")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise ValueError(f"space[{name!r}] must be a list of values, got {values!r}")
        if not values:
            raise ValueError(f"space[{name!r}] is empty: give it at least one value")
        seen: set[str] = set()
        for value in values:
            check_config_value(name, value, f"space[{name!r}]")
            key = config_key({"v": value})
            if key in seen:
                raise ValueError(f"space[{name!r}] lists {value!r} twice")
            seen.add(key)
        checked.append((name, list(values)))
    return checked


def config_grid(space: Space) -> list[dict[str, ConfigValue]]:
    """Every configuration of ``space`` (``{hyperparameter: [values]}``), the last hyperparameter
    varying fastest: ``config_grid({"lr": [1, 2], "t": [0.5, 1.0]})`` is ``lr=1,t=0.5``,
    ``lr=1,t=1.0``, ``lr=2,t=0.5``, ``lr=2,t=1.0``. Raises ``ValueError`` for an empty space, an
    empty or repeated value, or a value that is not a JSON scalar."""
    checked = _check_space(space)
    names = [name for name, _ in checked]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in checked))]


def sample_configs(
    space: Space, n: int, seed: int = 0, *, balanced: bool = False
) -> list[dict[str, ConfigValue]]:
    """``n`` distinct configurations of ``space``, seeded, in :func:`config_grid`'s order.

    By default they are drawn uniformly without replacement from the grid (the grid is not
    built: the draw is over its indices). ``balanced=True`` draws a Latin-hypercube design
    instead: each hyperparameter's values appear as evenly as ``n`` allows (``⌊n/k⌋`` or
    ``⌈n/k⌉`` times each of ``k`` values, which ones get the extra drawn at random), the columns
    shuffled independently and drawn again until the ``n`` configurations are distinct, so a
    small sweep does not leave a value with few configurations by chance. Raises ``ValueError``
    when ``n`` is not between 1 and the grid's size, or when no balanced design of distinct
    configurations turns up in 1,000 draws.
    """
    checked = _check_space(space)
    sizes = [len(values) for _, values in checked]
    total = math.prod(sizes)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
        raise ValueError(f"n must be an int from 1 to the grid's {total} configurations, got {n!r}")
    rng = random.Random(seed)
    indices = _balanced_indices(sizes, n, rng) if balanced else rng.sample(range(total), n)
    configs = []
    for index in sorted(indices):
        digits = []
        for size in reversed(sizes):  # mixed radix, the last hyperparameter the fastest digit
            index, digit = divmod(index, size)
            digits.append(digit)
        digits.reverse()
        configs.append({name: values[d] for (name, values), d in zip(checked, digits, strict=True)})
    return configs


def _balanced_indices(sizes: list[int], n: int, rng: random.Random) -> list[int]:
    """Grid indices of ``n`` distinct configurations whose every column holds its values evenly."""
    for _ in range(1000):
        columns = []
        for size in sizes:
            order = list(range(size))
            rng.shuffle(order)  # which values get the extra appearances when size does not divide n
            column = [order[i % size] for i in range(n)]
            rng.shuffle(column)
            columns.append(column)
        indices = set()
        for digits in zip(*columns, strict=True):
            index = 0
            for digit, size in zip(digits, sizes, strict=True):
                index = index * size + digit
            indices.add(index)
        if len(indices) == n:
            return list(indices)
    raise ValueError(f"no balanced design of {n} distinct configurations found in 1,000 draws: lower n")


def _check_configs(configs: Sequence[Mapping[str, Any]]) -> list[dict[str, ConfigValue]]:
    if isinstance(configs, Mapping) or not isinstance(configs, Sequence):
        raise ValueError("configs must be a list of configurations (e.g. config_grid(space))")
    if not configs:
        raise ValueError("configs is empty: nothing to run")
    keys = None
    seen: dict[str, int] = {}
    checked = []
    for i, config in enumerate(configs):
        if not isinstance(config, Mapping) or not config:
            raise ValueError(
                f"configs[{i}] must be a non-empty mapping {{hyperparameter: value}}, got {config!r}"
            )
        names = sorted(config)
        if keys is None:
            keys = names
        elif names != keys:
            raise ValueError(
                f"configs[{i}] sets {names}, configs[0] sets {keys}: every configuration must set the "
                f"same hyperparameters (only in configs[{i}]: {sorted(set(names) - set(keys))}; "
                f"only in configs[0]: {sorted(set(keys) - set(names))})"
            )
        for name, value in config.items():
            check_config_value(name, value, f"configs[{i}]")
        key = config_key(config)
        if key in seen:
            raise ValueError(f"configs[{i}] repeats configs[{seen[key]}]: {key}")
        seen[key] = i
        checked.append(dict(config))
    return checked


def _check_seeds(seeds: Sequence[int]) -> list[int]:
    if isinstance(seeds, int) or not isinstance(seeds, Sequence):
        raise ValueError(f"seeds must be a list of ints (e.g. [0, 1, 2]), got {seeds!r}")
    if not seeds:
        raise ValueError("seeds is empty: give at least one training seed")
    seen: set[int] = set()
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int):
            raise ValueError(f"a seed must be an int, got {s!r}")
        if s in seen:
            raise ValueError(f"seeds lists {s} twice")
        seen.add(s)
    return list(seeds)


# --------------------------------------------------------------------------- the results file


def _parse_rows(path: Path) -> tuple[list[SweepRow], int, bool]:
    """The rows of ``path``, the byte length of its complete lines, and whether a torn last
    line (no newline) follows them."""
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1  # a kill mid-write leaves a last line without its newline
    rows = []
    for number, line in enumerate(data[:complete].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rows.append(SweepRow.model_validate(json.loads(line)))
        except ValueError as e:  # JSON and validation errors alike
            raise ValueError(f"{path} line {number} is not a sweep row: {e}") from None
    return rows, complete, complete < len(data)


def _latest(rows: Sequence[SweepRow]) -> dict[tuple[str, int], SweepRow]:
    last: dict[tuple[str, int], SweepRow] = {}
    for row in rows:
        last.pop(row.key, None)  # a retried run moves to where its last row is
        last[row.key] = row
    return last


def read_sweep(path: str | Path, *, history: bool = False) -> list[SweepRow]:
    """The rows of the results file ``path``: each run's last row (a retried run's earlier
    failure dropped), in the order the runs finished; ``history=True`` returns every row as
    written. A torn last line is ignored (:func:`run_sweep` cuts it off when it resumes). Raises
    ``FileNotFoundError`` for a missing file and ``ValueError`` naming a malformed line."""
    rows, _, torn = _parse_rows(Path(path))
    if torn:
        logger.warning("%s ends in a torn line (a sweep killed while writing): ignored", path)
    return rows if history else list(_latest(rows).values())


def _append(path: Path, row: SweepRow) -> None:
    """One line, one ``write`` to a file opened for appending, on disk before returning."""
    line = (json.dumps(row.model_dump(), allow_nan=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = 0
        while written < len(line):
            written += os.write(fd, line[written:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_same_space(path: Path, rows: Sequence[SweepRow], keys: list[str]) -> None:
    for i, row in enumerate(rows):
        have = sorted(row.config)
        if have != keys:
            raise ValueError(
                f"{path} was written for a different space: its rows set {have}, these configs "
                f"{keys} (only in the file: {sorted(set(have) - set(keys))}; only in the configs: "
                f"{sorted(set(keys) - set(have))}; row {i + 1}). Use another results file."
            )


def _metrics_of(result: Any) -> dict[str, float]:
    if not isinstance(result, Mapping):
        raise TypeError(f"run returned a {type(result).__name__}, not a mapping of metric names to numbers")
    metrics = {}
    for name, value in result.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"run returned the metric {name!r}: {value!r}; metrics are str -> number")
        metrics[name] = float(value)
    return metrics


def run_sweep(
    run: Callable[[dict[str, ConfigValue], int], Mapping[str, float]],
    configs: Sequence[Mapping[str, ConfigValue]],
    seeds: Sequence[int],
    results_path: str | Path,
    *,
    retry_failed: bool = False,
    on_row: Callable[[SweepRow], None] | None = None,
) -> list[SweepRow]:
    """Run ``run(config, seed) -> {metric: value}`` for every configuration and seed that the
    JSONL file ``results_path`` does not hold yet, appending one :class:`SweepRow` per run.

    Runs already in the file are skipped (so the same call resumes a killed sweep), and so are
    failed ones unless ``retry_failed=True``. A run that raises, or returns something that is
    not a mapping of names to numbers, is recorded with its error and the sweep goes on;
    ``KeyboardInterrupt`` stops it. ``on_row`` sees each new row (progress). Returns the last
    row of every requested run, in run order (seed-major). Raises ``ValueError`` for empty or
    mismatched configurations, a value that is not a JSON scalar, repeated configurations or
    seeds, and a results file written for a different space (the keys that differ named).
    """
    checked = _check_configs(configs)
    seed_list = _check_seeds(seeds)
    path = Path(results_path)
    rows: list[SweepRow] = []
    if path.exists():
        rows, complete, torn = _parse_rows(path)
        if torn:
            logger.warning("%s: cutting off a torn last line (a sweep killed while writing it)", path)
            with path.open("r+b") as f:
                f.truncate(complete)
        _check_same_space(path, rows, sorted(checked[0]))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    done = _latest(rows)
    result: list[SweepRow] = []
    for seed in seed_list:
        for config in checked:
            key = (config_key(config), seed)
            previous = done.get(key)
            if previous is not None and (previous.error is None or not retry_failed):
                result.append(previous)
                continue
            started = time.perf_counter()
            try:
                metrics, error = _metrics_of(run(dict(config), seed)), None
            except Exception as e:  # the run's failure is data: recorded, and the sweep goes on
                logger.warning("sweep run %s seed %d failed", key[0], seed, exc_info=True)
                metrics, error = {}, f"{type(e).__name__}: {e}"
            row = SweepRow(
                config=config, seed=seed, metrics=metrics, seconds=time.perf_counter() - started, error=error
            )
            _append(path, row)
            result.append(row)
            if on_row is not None:
                on_row(row)
    return result
