"""One run protocol for every trainer: typed step records, and callbacks that see them and can stop the run.

Each trainer (:func:`~tapekit.training.sft.train_sft`, :func:`~tapekit.training.dpo.train_dpo`,
:func:`~tapekit.training.rl.train_rl`) hands a :class:`StepRecord` to every
:class:`StepCallback` in its ``callbacks`` after each optimiser step (RL: after each RL step);
a callback whose :meth:`StepCallback.on_step` returns ``True`` stops the run after that step,
which then ends normally (the result is written, the store closed):

>>> from tapekit.training import EarlyStopping, StopAfter
>>> stops = [StopAfter(seconds=300), EarlyStopping("reward", patience=5)]
>>> train_rl(setup, model, tok, config, callbacks=stops)  # doctest: +SKIP

SFT and DPO run on transformers' ``Trainer``; there the step callbacks ride on one
``transformers.TrainerCallback`` (:func:`hf_adapter`), which sets ``control.should_training_stop``,
and the ``callbacks`` list may mix them with plain ``transformers`` callbacks. Nothing heavy is
imported here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tapekit.errors import TrainingError


class StepRecord(BaseModel):
    """What one training step did, in the same shape for every trainer.

    - ``trainer``: ``"sft"``, ``"dpo"`` or ``"rl"``.
    - ``step``: the steps done so far, this one included (1 after the first step).
    - ``seconds``: wall time since the run began; ``step_seconds``: this step's own time
      (RL: rollouts and training; SFT/DPO: the optimiser step), so the sum of ``step_seconds``
      leaves out what callbacks do between steps (an evaluation, say).
    - ``loss``: the training loss (SFT/DPO: only on logging steps, ``None`` between them);
      ``reward``: the mean reward of the step's rollouts (RL only); ``tokens``: tokens trained on
      in this step (RL) or input tokens seen so far (SFT/DPO), when known.
    - ``metrics``: everything else the trainer logged (RL: the whole ``rl_log.jsonl`` record;
      SFT/DPO: transformers' logs, e.g. ``learning_rate``, ``grad_norm``, ``rewards/margins``).
    """

    model_config = ConfigDict(extra="forbid")

    trainer: Literal["sft", "dpo", "rl"]
    step: int = Field(ge=0)
    seconds: float = Field(ge=0)
    step_seconds: float = Field(0.0, ge=0)
    loss: float | None = None
    reward: float | None = None
    tokens: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """The number called ``name``: a field (``loss``, ``reward``, ``seconds``, ...) or a
        numeric entry of ``metrics``; ``None`` when this record has none."""
        found = getattr(self, name) if name in type(self).model_fields and name != "metrics" else None
        if found is None:
            found = self.metrics.get(name)
        if isinstance(found, bool) or not isinstance(found, int | float):
            return None
        return float(found)

    def scalars(self) -> dict[str, float]:
        """Every number of the record by name (fields, then the numeric metrics; nested dicts of
        numbers flattened as ``name/key``): what a tracker logs."""
        out: dict[str, float] = {}
        for key in ("loss", "reward", "tokens", "seconds", "step_seconds"):
            number = self.value(key)
            if number is not None:
                out[key] = number
        for key, item in self.metrics.items():
            if key in out or key == "step":
                continue
            if isinstance(item, dict):
                for sub, number in item.items():
                    if isinstance(number, int | float) and not isinstance(number, bool):
                        out[f"{key}/{sub}"] = float(number)
            elif isinstance(item, int | float) and not isinstance(item, bool):
                out[key] = float(item)
        return out


class StepCallback:
    """The base of step callbacks: override any of the three hooks.

    ``on_step`` returns ``True`` to stop the run after this step (``None``/``False``: go on).
    Every callback sees every record, also after another one asked to stop.
    """

    def on_begin(self, trainer: str) -> None:
        """The run of ``trainer`` (``"sft"``, ``"dpo"``, ``"rl"``) starts."""

    def on_step(self, record: StepRecord) -> bool | None:
        """One step is done; return ``True`` to stop the run."""
        return None

    def on_end(self) -> None:
        """The run ended (finished, stopped, or failed)."""

    @property
    def reason(self) -> str:
        """Why this callback stopped the run (after ``on_step`` returned ``True``)."""
        return type(self).__name__


class StopAfter(StepCallback):
    """Stop once ``steps`` steps are done or ``seconds`` of training time are spent (the sum of
    the records' ``step_seconds``: time callbacks spend between steps is not counted), whichever
    comes first. Give at least one; the step that crosses the budget is finished, not cut."""

    def __init__(self, *, seconds: float | None = None, steps: int | None = None) -> None:
        if seconds is None and steps is None:
            raise ValueError("StopAfter needs seconds=..., steps=... or both")
        if seconds is not None and seconds <= 0:
            raise ValueError(f"StopAfter: seconds must be > 0, got {seconds}")
        if steps is not None and steps <= 0:
            raise ValueError(f"StopAfter: steps must be > 0, got {steps}")
        self.seconds, self.steps = seconds, steps
        self.spent = 0.0
        self._reason = ""

    def on_begin(self, trainer: str) -> None:
        """Reset the clock (one object can budget several runs, one after the other)."""
        self.spent, self._reason = 0.0, ""

    def on_step(self, record: StepRecord) -> bool | None:
        """Count the step's time; ``True`` once a budget is spent."""
        self.spent += record.step_seconds
        if self.steps is not None and record.step >= self.steps:
            self._reason = f"StopAfter: {record.step} steps done (budget {self.steps})"
        elif self.seconds is not None and self.spent >= self.seconds:
            self._reason = f"StopAfter: {self.spent:.1f} s of training spent (budget {self.seconds:g} s)"
        return bool(self._reason) or None

    @property
    def reason(self) -> str:
        """Which budget was spent."""
        return self._reason or "StopAfter"


class EarlyStopping(StepCallback):
    """Stop when ``metric`` (a :meth:`StepRecord.value` name: ``"reward"``, ``"loss"``, a metric
    such as ``"score_strict"``) has not improved by more than ``min_delta`` on the best value
    for ``patience`` records that carry it. ``mode``: ``"max"`` (default for ``reward``) or
    ``"min"`` (default for ``loss``; for any other metric ``"max"``). Records without the
    metric are not counted."""

    def __init__(
        self,
        metric: str = "reward",
        patience: int = 3,
        *,
        mode: Literal["min", "max"] | None = None,
        min_delta: float = 0.0,
    ) -> None:
        if patience <= 0:
            raise ValueError(f"EarlyStopping: patience must be > 0, got {patience}")
        if min_delta < 0:
            raise ValueError(f"EarlyStopping: min_delta must be >= 0, got {min_delta}")
        if mode not in (None, "min", "max"):
            raise ValueError(f"EarlyStopping: mode must be 'min' or 'max', got {mode!r}")
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.mode: Literal["min", "max"] = mode or ("min" if metric == "loss" else "max")
        self.best: float | None = None
        self.waited = 0

    def on_begin(self, trainer: str) -> None:
        """Forget the previous run's best value."""
        self.best, self.waited = None, 0

    def on_step(self, record: StepRecord) -> bool | None:
        """``True`` after ``patience`` records in a row without improvement."""
        value = record.value(self.metric)
        if value is None or math.isnan(value):
            return None
        better = (
            self.best is None
            or (self.mode == "max" and value > self.best + self.min_delta)
            or (self.mode == "min" and value < self.best - self.min_delta)
        )
        if better:
            self.best, self.waited = value, 0
            return None
        self.waited += 1
        return self.waited >= self.patience or None

    @property
    def reason(self) -> str:
        """The metric that stopped improving."""
        return f"EarlyStopping: {self.metric} did not improve on {self.best} for {self.waited} records"


class ReportTo(StepCallback):
    """Log every record's numbers (:meth:`StepRecord.scalars`) to the trackers ``report_to``
    names, through transformers' own integrations: ``"tensorboard"``, ``"trackio"``,
    ``"wandb"``, ``"mlflow"`` and the others of ``transformers.integrations`` (the same names as
    ``TrainingArguments.report_to``). SFT and DPO pass their ``report_to`` to transformers
    directly; :func:`~tapekit.training.rl.train_rl` adds this callback for its config's.

    Each tracker's package must be installed: a missing one is a ``TrainingError`` naming it,
    raised here, before any training. TensorBoard's event files go where SFT's do:
    ``output_dir/runs/<date>_<host>`` (or ``$TENSORBOARD_LOGGING_DIR``).
    """

    def __init__(self, report_to: Sequence[str], output_dir: str, run_name: str | None = None) -> None:
        from transformers import TrainerControl, TrainerState, TrainingArguments

        self.trackers: list[Any] = [tracker for _, tracker in _trackers(report_to)]
        names = list(report_to)
        self.args = TrainingArguments(output_dir=output_dir, run_name=run_name, report_to=names)
        self.state, self.control = TrainerState(), TrainerControl()

    def on_begin(self, trainer: str) -> None:
        """Open the trackers' runs."""
        for tracker in self.trackers:
            tracker.on_train_begin(self.args, self.state, self.control, model=None)

    def on_step(self, record: StepRecord) -> bool | None:
        """Log the record's numbers at its step."""
        self.state.global_step = record.step
        logs = record.scalars()
        for tracker in self.trackers:
            tracker.on_log(self.args, self.state, self.control, logs=dict(logs))
        return None

    def on_end(self) -> None:
        """Close the trackers' runs."""
        for tracker in self.trackers:
            tracker.on_train_end(self.args, self.state, self.control)


def _trackers(report_to: Sequence[str]) -> list[tuple[str, Any]]:
    """``(name, callback)`` for each tracker ``report_to`` names, each callback made once (which
    is where transformers' integrations check that their package is installed). ``[]`` and
    ``["none"]`` name none, ``["all"]`` every installed one, as ``TrainingArguments`` reads
    them. An unknown name or a missing package is a ``TrainingError`` naming it."""
    if isinstance(report_to, str):
        raise TrainingError(f"report_to must be a list of tracker names, not the string {report_to!r}")
    names = list(report_to)
    if names in ([], ["none"]):
        return []  # nothing to check, and nothing of transformers to import
    from transformers.integrations import (
        get_available_reporting_integrations,
        get_reporting_integration_callbacks,
    )

    if names == ["all"]:
        names = list(get_available_reporting_integrations())
    try:
        classes = get_reporting_integration_callbacks(names)
    except ValueError as e:
        raise TrainingError(f"report_to: {e}") from None
    trackers: list[tuple[str, Any]] = []
    for name, cls in zip(names, classes, strict=True):
        try:
            trackers.append((name, cls()))
        except (ImportError, RuntimeError) as e:
            raise TrainingError(
                f"report_to {name!r} needs its package installed ({e}); install it "
                f"(for example `pip install {name}`) or leave {name!r} out of report_to"
            ) from None
    return trackers


def check_report_to(report_to: Sequence[str]) -> None:
    """Check, before any work, that every tracker ``report_to`` names exists and has its
    package installed: an unknown name or a missing package is a ``TrainingError`` naming it.
    SFT and DPO call it before they load data or a model (transformers would fail later, with a
    ``RuntimeError``); RL checks through :class:`ReportTo`."""
    _trackers(report_to)


def notify(callbacks: Sequence[StepCallback], record: StepRecord) -> str | None:
    """Give ``record`` to every callback; the reason of the first that asks to stop, else ``None``."""
    reasons = [c.reason for c in callbacks if c.on_step(record)]
    return reasons[0] if reasons else None


def split_callbacks(callbacks: Iterable[Any] | None) -> tuple[list[StepCallback], list[Any]]:
    """``callbacks`` split into tapekit step callbacks and the rest (``transformers`` callbacks)."""
    steps: list[StepCallback] = []
    others: list[Any] = []
    for callback in callbacks or []:
        (steps if isinstance(callback, StepCallback) else others).append(callback)
    return steps, others


def hf_adapter(trainer: Literal["sft", "dpo"], callbacks: Sequence[StepCallback]) -> Any:
    """One ``transformers.TrainerCallback`` that turns the ``Trainer``'s steps into
    :class:`StepRecord` for ``callbacks`` and stops the training when one of them asks.

    A step on which transformers logs becomes a record when its logs arrive (with the loss);
    the others become records at the step's end. ``stopped`` holds the reason, if any."""
    from transformers import TrainerCallback

    class _StepRecords(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.callbacks = list(callbacks)
            self.stopped: str | None = None
            self.t0 = self.step_t0 = time.perf_counter()
            self.pending: tuple[int, float] | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = time.perf_counter()
            for callback in self.callbacks:
                callback.on_begin(trainer)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_t0 = time.perf_counter()

        def _emit(self, state: Any, control: Any, step_seconds: float, logs: dict[str, Any]) -> None:
            loss = logs.get("loss")
            record = StepRecord(
                trainer=trainer,
                step=state.global_step,
                seconds=time.perf_counter() - self.t0,
                step_seconds=step_seconds,
                loss=float(loss) if isinstance(loss, int | float) else None,
                tokens=int(state.num_input_tokens_seen) or None,
                metrics={k: v for k, v in logs.items() if k != "loss"},
            )
            reason = notify(self.callbacks, record)
            if reason is not None:
                self.stopped = self.stopped or reason
                control.should_training_stop = True

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seconds = time.perf_counter() - self.step_t0
            if control.should_log:  # transformers' flow callback ran first: the logs follow
                self.pending = (state.global_step, seconds)
            else:
                self._emit(state, control, seconds, {})

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if self.pending is None or self.pending[0] != state.global_step:
                return  # the end-of-training summary, or an evaluation's logs
            _, seconds = self.pending
            self.pending = None
            self._emit(state, control, seconds, dict(logs or {}))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            for callback in self.callbacks:
                callback.on_end()

    return _StepRecords()
