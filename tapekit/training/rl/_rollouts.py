"""Rollouts for on-policy RL: G attempts per task through the batch runner, scored and stored.

:func:`collect_rollouts` runs one RL step's rollouts: for each task, ``group_size`` copies of
its start tape run through :func:`tapekit.batch.abatch` (multi-turn, tools and forks work as
in any batch) on an agent whose LLM samples (temperature > 0). With a
:class:`~tapekit.llm.batched.BatchedTransformersLLM`, the batcher runs in lockstep
with the batch: every LLM round of all the tapes is one batched ``generate``.

Every tape is scored by every scorer (strict and lenient side by side, say); the reward is the
score of one named scorer. The tape's ``metadata.result`` records the scores, the reward, the
task, its category, the RL step and the policy version, and the tape is stored under the tags
``rl:<run>``, ``rl:<run>:step:<n>``, ``rl:<run>:policy:<v>`` and ``rl:<run>:task:<id>`` (so
the Studio lists one task's rollouts across steps). :func:`rollout_rows` turns the tapes into
token-exact samples (:func:`~tapekit.training.samples.make_samples`, ids from the store) with
the ``task_id``, ``category`` and ``policy_version`` columns that
:func:`~tapekit.training.rl.make_rl_batch` reads.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tapekit.core import Tape
from tapekit.environment import environment_failure
from tapekit.errors import TrainingError
from tapekit.evaluate import Score, Task
from tapekit.llm.base import LLMCall
from tapekit.store.base import TapeStore


@dataclass
class RolloutBatch:
    """One step's rollouts: the scored tapes (``group_size`` per task, in task order), each
    tape's task, the policy version that sampled them, timing, and the tokens the policy
    prefilled (``prompt_tokens``, every call's whole prompt) and sampled (``output_tokens``)."""

    step: int
    policy_version: int
    tapes: list[Tape[Any, Any]]
    tasks: list[Task]
    reward_name: str
    seconds: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0
    failed: int = 0
    environment_failures: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        """The reward of each kept tape (:attr:`kept`)."""
        return [float(t.metadata.result["reward"]) for t in self.kept]

    @property
    def kept(self) -> list[Tape[Any, Any]]:
        """The tapes whose episode the environment did not end by failing: the ones that say
        something about the policy (see :func:`~tapekit.environment.environment_failure`)."""
        return [t for t in self.tapes if not t.metadata.result.get("environment_failure")]

    @property
    def kept_task_ids(self) -> set[str]:
        """The tasks of the batch's groups: those with at least one :attr:`kept` tape (a task
        whose every rollout the environment failed gives GRPO no group)."""
        return {str(t.metadata.result["task_id"]) for t in self.kept}

    @property
    def category_rewards(self) -> list[tuple[str, float]]:
        """Each kept tape's task category (``"default"`` for none) and reward."""
        return [
            (str(t.metadata.result.get("category") or "default"), float(t.metadata.result["reward"]))
            for t in self.kept
        ]

    def scores(self, name: str) -> list[float]:
        """Each kept tape's value under scorer ``name``."""
        return [float(t.metadata.result["scores"][name]) for t in self.kept]

    @property
    def tokens_per_s(self) -> float:
        """Sampled tokens per second of the rollout."""
        return self.output_tokens / self.seconds if self.seconds else 0.0


def rollout_tags(run: str, step: int, policy_version: int, task_id: str) -> list[str]:
    """The store tags of one rollout tape."""
    return [
        f"rl:{run}",
        f"rl:{run}:step:{step}",
        f"rl:{run}:policy:{policy_version}",
        f"rl:{run}:task:{task_id}",
    ]


async def score_value(scorer: Callable[..., Any], tape: Tape[Any, Any], task: Task) -> float:
    """A scorer's value for ``tape`` as a float (a :class:`Score`, a bool, or an awaitable)."""
    out = scorer(tape, task)
    if inspect.isawaitable(out):
        out = await out
    if isinstance(out, Score):
        return float(out.value)
    if isinstance(out, bool | int | float):
        return float(out)
    raise TypeError(
        f"scorer {getattr(scorer, '__name__', scorer)!r} returned {type(out).__name__}, not a Score"
    )


def _start(task: Task, k: int, g: int, step: int, run: str) -> Tape[Any, Any]:
    """The start tape of attempt ``g`` at the step's ``k``-th task (an id naming run, step,
    position, task and attempt: deterministic, and unique when a task is drawn twice)."""
    tape = task.start_tape()
    return tape.with_metadata(id=f"{run}.s{step}.t{k}.{task.id}.g{g}", parent_id=tape.metadata.id)


async def acollect_rollouts(
    agent: Any,
    environment: Any,
    tasks: Sequence[Task],
    scorers: Mapping[str, Callable[..., Any]],
    *,
    reward: str,
    group_size: int,
    step: int,
    policy_version: int,
    store: TapeStore,
    run: str = "rl",
    attempt: int = 0,
    max_loops: int | None = None,
    batcher: Any = None,
    seed: int | None = None,
    backend: Literal["local", "ray"] = "local",
    ray_workers: int | None = None,
    first_index: int = 0,
) -> RolloutBatch:
    """The async form of :func:`collect_rollouts`."""
    from tapekit.batch import abatch

    if reward not in scorers:
        raise ValueError(f"collect_rollouts: reward {reward!r} is not one of the scorers {sorted(scorers)}")
    if group_size < 1:
        raise ValueError(f"collect_rollouts: group_size must be >= 1, got {group_size}")
    if not tasks:
        raise ValueError("collect_rollouts: no tasks")
    if store is None:
        raise ValueError("collect_rollouts: a store is needed (the samples read the token ids from it)")
    if backend == "ray" and batcher is not None:
        raise ValueError(
            "collect_rollouts: backend='ray' cannot run an in-process policy (a batcher was given: "
            "a BatchedTransformersLLM's model and lockstep batcher live in this process, and Ray "
            "workers would sample from stale copies); serve the policy (vLLM or another "
            "OpenAI-compatible server) and give the agent an OpenAI-compatible LLM, or use backend='local'"
        )
    if first_index < 0:
        raise ValueError(f"collect_rollouts: first_index must be >= 0, got {first_index}")
    starts, owners = [], []
    for k, task in enumerate(tasks, start=first_index):
        for g in range(group_size):
            starts.append(_start(task, k, g, step, run))
            owners.append(task)
    name = f"rl-{run}-step{step}-a{attempt}" + (f"-t{first_index}" if first_index else "")
    started = time.perf_counter()
    if batcher is not None:
        batcher.expect(len(starts), seed)
    finals: list[Tape[Any, Any] | None] = [None] * len(starts)
    out = RolloutBatch(step, policy_version, [], list(owners), reward)
    try:
        results = abatch(
            agent,
            environment,
            starts,
            store=store,
            name=name,
            max_loops=max_loops,
            max_concurrency=len(starts),
            backend=backend,
            ray_workers=ray_workers,
        )
        async for result in results:
            finals[result.index] = result.tape
            calls, prompt_tokens, output_tokens = _tape_tokens(result, store)
            out.prompt_tokens += prompt_tokens
            out.output_tokens += output_tokens
            out.llm_calls += calls
            out.failed += result.error is not None
            if batcher is not None:
                batcher.finished()
    finally:
        if batcher is not None:
            batcher.release()
    out.seconds = time.perf_counter() - started
    for i, (tape, task) in enumerate(zip(_canonical(finals, [t.id for t in owners]), owners, strict=True)):
        scores = {n: await score_value(s, tape, task) for n, s in scorers.items()}
        record: dict[str, Any] = {
            "scores": scores,
            "reward": scores[reward],
            "task_id": task.id,
            "category": task.category,
            "rl_step": step,
            "policy_version": policy_version,
            "attempt": i % group_size,
        }
        why = environment_failure(tape)
        if why:  # the browser or server failed, not the policy: recorded, left out of the groups
            record["environment_failure"] = why
            out.environment_failures += 1
        tape = tape.with_metadata(result=record)
        store.save_tape(tape, tags=rollout_tags(run, step, policy_version, task.id))
        out.tapes.append(tape)
    store.flush()
    return out


def _tape_tokens(result: Any, store: TapeStore) -> tuple[int, int, int]:
    """The LLM calls, prompt and output tokens behind one rollout tape: the batch runner's
    counts for a tape it ran from its start; the store's totals for the tape when it was done
    (or begun) by an earlier attempt of the same step and only read back (or continued) now, so
    a step resumed after a kill reports the same tokens as one that was never stopped."""
    if not (result.skipped or result.resumed):
        return result.llm_calls, result.prompt_tokens, result.output_tokens
    row = store.totals(by="tape", tape_id=result.tape_id).get(result.tape_id, {})
    return int(row.get("calls", 0)), int(row.get("prompt_tokens", 0)), int(row.get("output_tokens", 0))


def _content(tape: Tape[Any, Any]) -> str:
    return json.dumps([s.model_dump(mode="json", exclude={"metadata"}) for s in tape.steps], sort_keys=True)


def _canonical(tapes: list[Tape[Any, Any] | None], keys: Sequence[str]) -> list[Tape[Any, Any]]:
    """The tapes with the attempts of each task sorted by content over that task's slots.

    Attempts of one task start from the same prompt, so which of them got which sample (which
    row of a batched ``generate``) depends on timing; a task drawn twice in a step has its two
    groups' attempts interchangeable too. Sorted over all the task's slots, the result does not
    depend on timing."""
    done = [t for t in tapes if t is not None]
    if len(done) != len(tapes):
        raise RuntimeError("collect_rollouts: the batch runner returned no tape for some attempt")
    slots: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        slots.setdefault(key, []).append(i)
    out = list(done)
    for positions in slots.values():
        for i, tape in zip(positions, sorted((done[i] for i in positions), key=_content), strict=True):
            out[i] = tape
    return out


def collect_rollouts(
    agent: Any,
    environment: Any,
    tasks: Sequence[Task],
    scorers: Mapping[str, Callable[..., Any]],
    **options: Any,
) -> RolloutBatch:
    """Run ``group_size`` attempts of every task, score and store them (see the module doc).

    Options: ``reward`` (the scorer whose value is the reward), ``group_size``, ``step``,
    ``policy_version``, ``store`` (required: the tapes and their LLM calls go there), ``run`` (the
    run's name, in ids and tags), ``attempt`` (a restarted step's rollouts get new ids),
    ``max_loops``, ``batcher`` (a lockstep :class:`RequestBatcher`), ``seed`` (its sampling seed for
    this step) and ``first_index`` (the step position of the first task, for a further round of the
    same step: its tapes get ids of their own). ``backend="ray"`` (with ``ray_workers``) spreads the
    tapes over Ray workers (:func:`tapekit.batch.abatch`): the agent is pickled to them, so its LLM
    must reach the policy from another process (an OpenAI-compatible server such as vLLM), and the
    store must be one they can open (an SQLite file on one machine, PostgreSQL across machines). An
    in-process policy with a ``batcher`` is refused.
    """
    from tapekit._sync import run_sync

    return run_sync(acollect_rollouts(agent, environment, tasks, scorers, **options))


def live_groups(rollouts: RolloutBatch, key: str = "task_id") -> int:
    """How many of the batch's groups (its kept tapes grouped by ``key``: ``"task_id"`` or
    ``"category"``, as the rows of :func:`rollout_rows`) are not zero-advantage groups of
    :func:`~tapekit.training.rl.group_advantages`: the groups that give GRPO a gradient."""
    from tapekit.training.rl._advantages import group_advantages

    if key not in ("task_id", "category"):
        raise ValueError(f"live_groups: key is 'task_id' or 'category', not {key!r}")
    keys = [_group_of(t.metadata.result, key) for t in rollouts.kept]
    groups = group_advantages(rollouts.rewards, keys)
    return len(groups.groups) - len(groups.zero_groups)


def merge_batches(first: RolloutBatch, more: RolloutBatch) -> RolloutBatch:
    """One batch of two rounds of the same step and policy version (``first``'s tapes, then
    ``more``'s; times and token counts added). A ValueError if the step or version differ."""
    a = (first.step, first.policy_version, first.reward_name)
    b = (more.step, more.policy_version, more.reward_name)
    if a != b:
        raise ValueError(
            f"merge_batches: the batches are of different steps, policy versions or rewards: {a} and {b}"
        )
    return RolloutBatch(
        first.step,
        first.policy_version,
        [*first.tapes, *more.tapes],
        [*first.tasks, *more.tasks],
        first.reward_name,
        seconds=first.seconds + more.seconds,
        prompt_tokens=first.prompt_tokens + more.prompt_tokens,
        output_tokens=first.output_tokens + more.output_tokens,
        llm_calls=first.llm_calls + more.llm_calls,
        failed=first.failed + more.failed,
        environment_failures=first.environment_failures + more.environment_failures,
    )


def rollout_rows(
    rollouts: RolloutBatch, store: TapeStore, tokenizer: Any, *, exact: bool = False
) -> list[dict[str, Any]]:
    """Token-exact samples of the rollouts (ids and sampling log-probs from the store), each
    row with ``task_id``, ``category`` and ``policy_version``; tapes without a sample (no LLM
    call, e.g. a failure before the first) and tapes the environment ended by failing
    (:attr:`RolloutBatch.kept`) are left out.

    ``exact=True`` refuses (:class:`~tapekit.training.TrainingError`) any call stored without
    token ids and sampling log-probs (never re-tokenised) or sampled by another policy version
    than the batch's."""
    from tapekit.training.samples import make_samples

    calls = _exact_calls(store, str(rollouts.policy_version)) if exact else store
    kept = rollouts.kept
    if not kept:
        return []
    samples = make_samples(kept, llm_calls=calls, tokenizer=tokenizer, reward=_reward)
    by_id = {t.metadata.id: t.metadata.result for t in kept}
    rows = []
    for row in samples.dataset:
        result = by_id[row["tape_id"]]
        row["task_id"] = result["task_id"]
        row["category"] = _group_of(result, "category")
        row["policy_version"] = result["policy_version"]
        rows.append(row)
    return rows


def _group_of(result: Mapping[str, Any], key: str) -> str:
    """A rollout's group under ``key`` (a task without a category is in ``"default"``)."""
    return str(result[key]) if key == "task_id" else str(result["category"] or "default")


def _reward(tape: Tape[Any, Any]) -> float:
    return float(tape.metadata.result["reward"])


def _exact_calls(store: TapeStore, version: str) -> Callable[[str], LLMCall | None]:
    """``store.get_llm_call``, refusing each call that lacks the ids and sampling log-probs
    of policy ``version``."""

    def get_llm_call(prompt_id: str) -> LLMCall | None:
        call = store.get_llm_call(prompt_id)
        if call is None:
            return None
        trace = call.tokens
        where = f"LLM call {prompt_id} (model {call.model!r})"
        if trace is None or trace.output_logprobs is None:
            missing = "token ids" if trace is None else "sampling log-probs"
            raise TrainingError(
                f"{where} came back without {missing}: RL trains on the tokens the policy sampled and "
                "does not re-tokenise (an OpenAI-compatible server must return them: vLLM >= 0.10.2)"
            )
        if trace.policy_version != version:
            raise TrainingError(
                f"{where} was sampled by policy version {trace.policy_version!r}, "
                f"not the rollouts' version {version!r}"
            )
        return call

    return get_llm_call
