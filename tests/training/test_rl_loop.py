"""The RL loop end to end on a tiny model: batched rollouts with exact sampling log-probs, RL
tapes stored with their step and policy version (and resumable and replayable like any tape),
sync and asynchronous runs, and ``tapekit train rl`` killed mid-step and resumed to the same
weights and records as an unbroken run."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tapekit.store import TapeFilter

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("datasets") is None,
    reason="needs torch and datasets (the train extra)",
)

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"rollout_seconds", "rollout_tokens_per_s", "step_seconds", "train_tokens_per_s"}


@pytest.fixture(autouse=True)
def _threads() -> None:
    import torch

    torch.set_num_threads(2)


def _config(tmp_path: Path, rollouts: dict[str, Any] | None = None, **changes: Any) -> Any:
    from tapekit.training.rl import RLRunConfig

    values: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "steps": 3,
        "learning_rate": 3e-3,
        "seed": 1,
    }
    sampled = {"tasks_per_step": 3, "group_size": 4, "max_tokens": 12, "max_loops": 2, **(rollouts or {})}
    return RLRunConfig(**{**values, "rollouts": sampled, **changes})


def test_batched_generate_records_the_sampling_logprobs_of_each_row() -> None:
    import torch

    from tapekit.llm.batched import BatchedTransformersLLM
    from tapekit.training.rl import token_logprobs
    from tests.training.rl_toy import PROBLEMS, make_model

    model, tokenizer = make_model()
    llm = BatchedTransformersLLM.from_model(model, tokenizer, temperature=1.0, max_tokens=10)
    prompts = [tokenizer(p.question, add_special_tokens=False)["input_ids"] for p in PROBLEMS[:6]]
    assert len({len(p) for p in prompts}) > 1  # rows of different lengths: left padding is used
    results = llm.generate_batch(prompts, seed=5)
    for prompt, (ids, logprobs) in zip(prompts, results, strict=True):
        assert 0 < len(ids) <= 10 and len(logprobs) == len(ids)
        x = torch.tensor([prompt + ids])
        with torch.no_grad():  # the same tokens alone, unpadded: the same log-probs
            alone = token_logprobs(model(input_ids=x).logits, x, 1.0)[0, len(prompt) :]
        assert alone.tolist() == pytest.approx(logprobs, abs=1e-4)
    assert llm.generate_batch(prompts, seed=5) == results  # seeded: the same samples
    assert llm.generate_batch(prompts, seed=6) != results


def test_what_a_batchs_prompts_share_is_prefilled_once_with_the_same_samples_and_logprobs() -> None:
    import torch

    from tapekit.llm.batched import SHARED_PREFIX_MIN, BatchedTransformersLLM, left_pad, shared_prompt_cache
    from tests.training.rl_toy import PROBLEMS, make_model

    model, tokenizer = make_model()
    questions = [tokenizer(p.question, add_special_tokens=False)["input_ids"] for p in PROBLEMS[:3]]
    assert len({len(p) for p in questions}) > 1  # rows of different lengths: padding between them
    system = questions[0][:4] * 6  # a shared "system prompt" of 24 tokens
    assert len(system) >= SHARED_PREFIX_MIN
    seen: list[tuple[int, ...]] = []  # the (rows, positions) of each forward pass
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)) if "input_ids" in kw else None,
        with_kwargs=True,
    )

    def both(prompts: list[list[int]]) -> tuple[list[Any], list[Any], list[list[tuple[int, ...]]]]:
        passes = []
        results = []
        for share in (True, False):
            seen.clear()
            llm = BatchedTransformersLLM.from_model(
                model, tokenizer, temperature=1.0, max_tokens=8, share_prompts=share
            )
            results.append(llm.generate_batch(prompts, seed=11))
            passes.append(list(seen))
        return results[0], results[1], passes

    try:
        # a GRPO step's first turn: three groups of four identical prompts, one system prompt
        grouped = sorted(system + q for q in questions for _ in range(4))
        width = max(len(p) for p in grouped)
        got, want, (shared, full) = both(grouped)
        rests = sorted(len(q) - 1 for q in questions)  # each distinct prompt's rest, alone, unpadded
        assert shared[0] == (1, len(system)) and sorted(n for _, n in shared[1:4]) == rests
        assert {rows for rows, _ in shared[1:4]} == {1} and shared[4] == (12, 1)
        assert full[0] == (12, width)  # the old way: every row's whole prompt
        assert len({tuple(ids) for ids, _ in got[:4]}) > 1  # a group's rows still sample apart
        # an evaluation: every prompt distinct, the system prompt shared
        distinct = [system + q for q in questions]
        got2, want2, (shared2, _) = both(distinct)
        assert shared2[0] == (1, len(system)) and sorted(n for _, n in shared2[1:4]) == rests
        assert sum(n for _, n in shared2[:4]) < 3 * max(map(len, distinct))  # fewer than left-padded
    finally:
        hook.remove()
    for a, b in ((got, want), (got2, want2)):
        assert [ids for ids, _ in a] == [ids for ids, _ in b]
        for (_, x), (_, y) in zip(a, b, strict=True):
            assert x == pytest.approx(y, abs=1e-4)
    # nothing shared: a plain left-padded batch and no cache
    ids, mask, cache = shared_prompt_cache(model, questions, 0)
    assert (
        cache is None
        and torch.equal(ids, left_pad(questions, 0)[0])
        and torch.equal(mask, left_pad(questions, 0)[1])
    )


def test_the_batched_sampler_draws_from_the_warped_distribution_and_records_its_logprobs() -> None:
    import torch

    from tapekit.llm.batched import _sampler

    rows = 40_000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]).repeat(rows, 1)
    for knobs, allowed in (
        ({"temperature": 0.5}, 6),
        ({"temperature": 2.0, "top_k": 3}, 3),
        ({"temperature": 1.0, "top_p": 0.8}, 3),  # 0.56, 0.21, 0.13 (0.89 >= 0.8), then cut
    ):
        kwargs = {**knobs, "max_new_tokens": 5}
        sampler = _sampler(kwargs, seed=3)
        assert kwargs == {"max_new_tokens": 5}  # the sampling knobs are the sampler's now
        out = sampler(torch.zeros((rows, 1), dtype=torch.long), logits.clone())
        token = out.argmax(dim=-1)
        assert (out.isfinite().sum(dim=-1) == 1).all()  # greedy decoding can only take the draw
        expected = torch.softmax(logits[0] / knobs["temperature"], dim=-1)
        expected[allowed:] = 0.0
        expected /= expected.sum()
        counts = torch.bincount(token, minlength=6).float() / rows
        assert counts[allowed:].sum() == 0  # nothing the warpers removed is ever drawn
        assert counts.tolist() == pytest.approx(expected.tolist(), abs=0.01)
        recorded = sampler.logprobs()[:, 0]
        assert recorded.tolist() == pytest.approx(expected.log()[token].tolist(), abs=1e-5)
    again = _sampler({"temperature": 1.0}, seed=3)(torch.zeros((rows, 1), dtype=torch.long), logits.clone())
    other = _sampler({"temperature": 1.0}, seed=4)(torch.zeros((rows, 1), dtype=torch.long), logits.clone())
    first = _sampler({"temperature": 1.0}, seed=3)(torch.zeros((rows, 1), dtype=torch.long), logits.clone())
    assert torch.equal(again, first) and not torch.equal(other, first)


def test_rollouts_are_scored_stored_tagged_and_become_rl_rows(tmp_path: Path) -> None:
    from tapekit import open_store
    from tapekit.llm.batched import BatchedTransformersLLM
    from tapekit.training.rl import RLConfig, collect_rollouts, grpo_step, make_rl_batch, rollout_rows
    from tests.training.rl_toy import make_model, make_setup

    model, tokenizer = make_model()
    setup = make_setup()
    llm = BatchedTransformersLLM.from_model(model, tokenizer, temperature=1.0, max_tokens=12)
    store = open_store(str(tmp_path / "rollouts.db"))
    tasks = list(setup.tasks[:3])
    batch = collect_rollouts(
        setup.agent_for(llm),
        setup.environment,
        tasks,
        setup.scorers,
        reward="digits",
        group_size=4,
        step=7,
        policy_version=5,
        store=store,
        run="toy",
        max_loops=2,
        batcher=llm.batcher,
        seed=3,
    )
    assert len(batch.tapes) == 12 and batch.failed == 0
    assert llm.batcher.stats.largest_batch == 12  # lockstep: all 12 first turns in one generate
    for tape, task in zip(batch.tapes, batch.tasks, strict=True):
        result = tape.metadata.result
        assert result["task_id"] == task.id and result["rl_step"] == 7 and result["policy_version"] == 5
        assert set(result["scores"]) == {"strict", "lenient", "steps", "digits"}
        assert result["reward"] == result["scores"]["digits"]
    assert len(store.list_tapes(where=TapeFilter(tag="rl:toy:step:7"))) == 12
    assert len(store.list_tapes(where=TapeFilter(tag="rl:toy:policy:5"))) == 12
    assert len(store.list_tapes(where=TapeFilter(tag=f"rl:toy:task:{tasks[0].id}"))) == 4
    stored = store.get_tape(batch.tapes[0].metadata.id)
    assert stored.metadata.result == batch.tapes[0].metadata.result
    rows = rollout_rows(batch, store, tokenizer)
    assert rows and all(r["has_logprobs"] and r["source"] == "ids" and r["policy_version"] == 5 for r in rows)
    assert {r["task_id"] for r in rows} == {t.id for t in tasks}
    config = RLConfig(pad_id=tokenizer.pad_token_id)
    optimizer = __import__("torch").optim.SGD(model.parameters(), lr=0.0)
    stats = grpo_step(model, optimizer, make_rl_batch(rows, config), config, policy_version=5)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-4)  # the stored log-probs are the policy's
    assert stats.policy_lag_mean == 0
    store.close()


def _failing_on(setup: Any, questions: set[str], why: str) -> Any:
    """``setup``'s environment, except that on the tapes of these questions it ends the episode
    by failing (marks its observations with ``why``), as a crashed or hung browser does."""
    from tapekit import Tape, UserStep
    from tapekit.environment import ENVIRONMENT_FAILURE, Environment

    class Failing(Environment):
        async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
            out = await setup.environment.areact(tape)
            if next(s for s in tape.steps if isinstance(s, UserStep)).content in questions:
                for step in out.steps[len(tape.steps) :]:
                    step.metadata.other[ENVIRONMENT_FAILURE] = why
            return out

    return Failing()


def test_a_step_whose_rollouts_are_read_back_after_a_kill_reports_their_tokens(tmp_path: Path) -> None:
    # a run killed after a step's rollouts were stored but before its checkpoint redoes the step
    # with the same batch name: the done tapes are read back, not run again, and the step's
    # record must still count the tokens the policy spent on them (CI once saw 0 there)
    from tapekit import open_store
    from tapekit.llm.batched import BatchedTransformersLLM
    from tapekit.training.rl import collect_rollouts
    from tests.training.rl_toy import make_model, make_setup

    model, tokenizer = make_model()
    llm = BatchedTransformersLLM.from_model(model, tokenizer, temperature=1.0, max_tokens=12)
    setup = make_setup()
    tasks = list(setup.tasks[:2])
    store = open_store(str(tmp_path / "rollouts.db"))

    def collect() -> Any:
        return collect_rollouts(
            setup.agent_for(llm), setup.environment, tasks, setup.scorers, reward="digits",
            group_size=2, step=0, policy_version=0, store=store, max_loops=2, batcher=llm.batcher, seed=3,
        )  # fmt: skip

    first = collect()
    assert first.llm_calls > 0 and first.prompt_tokens > 0 and first.output_tokens > 0
    again = collect()  # every tape done in the store: skipped by the batch runner
    assert [t.metadata.id for t in again.tapes] == [t.metadata.id for t in first.tapes]
    assert (again.llm_calls, again.prompt_tokens, again.output_tokens) == (
        first.llm_calls,
        first.prompt_tokens,
        first.output_tokens,
    )
    store.close()


def test_rollouts_the_environment_ended_by_failing_are_counted_and_left_out(tmp_path: Path) -> None:
    # an environment whose answers to one task's tapes say it failed (as a crashed browser's
    # do): those rollouts are recorded and counted, but give no reward, no group and no rows
    from tapekit import open_store
    from tapekit.environment import environment_failure
    from tapekit.training.rl import collect_rollouts, live_groups, rollout_rows
    from tests.training.rl_toy import make_model, make_setup, oracle_llm

    setup = make_setup()
    tasks = list(setup.tasks[:3])
    failing = _failing_on(setup, {tasks[0].question}, "the browser crashed and the replay failed")
    store = open_store(str(tmp_path / "failing.db"))
    batch = collect_rollouts(
        setup.agent_for(oracle_llm()), failing, tasks, setup.scorers, reward="steps",
        group_size=2, step=0, policy_version=0, store=store, max_loops=4,
    )  # fmt: skip
    assert len(batch.tapes) == 6 and batch.failed == 0 and batch.environment_failures == 2
    failed = [t for t in batch.tapes if t.metadata.result.get("environment_failure")]
    assert {t.metadata.result["task_id"] for t in failed} == {tasks[0].id}
    assert all(environment_failure(t) == "the browser crashed and the replay failed" for t in failed)
    assert [t.metadata.result["task_id"] for t in batch.kept] == [tasks[1].id] * 2 + [tasks[2].id] * 2
    assert batch.rewards == [1.0] * 4  # the oracle solves the rest; the failed ones are not counted as 0
    stored = store.get_tape(failed[0].metadata.id)
    assert stored.metadata.result["environment_failure"]  # kept in the store for the Studio
    assert live_groups(batch) == 0  # two groups left, each all solved
    _, tokenizer = make_model()
    rows = rollout_rows(batch, store, tokenizer)
    assert rows and {r["task_id"] for r in rows} == {tasks[1].id, tasks[2].id}
    store.close()


def test_a_step_whose_every_rollout_the_environment_failed_reports_no_reward_not_zero(tmp_path: Path) -> None:
    # a browser that hung for a whole step (every page load timed out, as once in CI): the
    # step's record says no reward (None), not a mean reward of 0 that reads as a policy that
    # failed every task; a step with one scored rollout reports it
    from tapekit import open_store
    from tapekit.training.rl import RLRunConfig, RLStepRecord, collect_rollouts, make_sampler
    from tapekit.training.rl._record import step_record
    from tests.training.rl_toy import make_setup, oracle_llm

    setup = make_setup()
    tasks = list(setup.tasks[:2])
    sampler = make_sampler(RLRunConfig(output_dir="unused", curriculum={"kind": "uniform"}), tasks)
    store = open_store(str(tmp_path / "rollouts.db"))

    def record(step: int, hung: set[str]) -> RLStepRecord:
        environment = _failing_on(setup, hung, "the task did not load within 30 s")
        batch = collect_rollouts(
            setup.agent_for(oracle_llm()), environment, tasks, setup.scorers, reward="steps",
            group_size=2, step=step, policy_version=step, max_loops=4, store=store,
        )  # fmt: skip
        return step_record(
            step, batch, None, None, sampler, seconds=1.0, step_seconds=1.0, scorer_names=list(setup.scorers)
        )

    hung = record(0, {t.question for t in tasks})
    assert hung.environment_failures == hung.rollouts == 4 and hung.scored_rollouts == 0
    assert hung.reward is None and hung.reward_std is None and hung.scores["steps"] is None
    assert hung.zero_adv_share == 1.0  # no group, nothing to train on
    assert hung.groups == 0 and hung.categories  # two tasks drawn, no group to train on
    assert hung.category_rewards == {}  # no scored rollout in any category
    line = hung.to_log()  # null in rl_log.jsonl, not 0
    assert line["reward_mean"] is None and line["score_steps"] is None and "grad_norm" not in line
    half = record(1, {tasks[0].question})
    assert half.environment_failures == 2 and half.scored_rollouts == 2
    assert half.groups == 1  # the failed task's group is not counted as trained
    assert half.reward == 1.0 and half.scores["steps"] == 1.0  # the oracle solves what ran
    assert half.category_rewards == {tasks[1].category or "default": 1.0}  # the task that ran
    store.close()


def test_an_rl_setup_whose_reward_is_not_a_scorer_is_refused() -> None:
    from tests.training.rl_toy import make_setup

    assert make_setup(reward="steps").reward == "steps"
    with pytest.raises(ValueError, match="reward 'exact' is not one of the scorers"):
        make_setup(reward="exact")


def test_the_toy_setup_scores_a_calculator_solution_in_full_and_its_tapes_replay(tmp_path: Path) -> None:
    # the toy itself (tests/training/rl_toy.py): an oracle that makes the problem's calculator calls one
    # turn at a time, then answers, gets the calculator's results and full marks on every task,
    # and its multi-turn tapes replay from the text the agent renders for each turn
    from tapekit import ToolResult, open_store, reconstruct_llm_calls, replay_tape
    from tapekit.training.rl import collect_rollouts
    from tests.training.rl_toy import PROBLEMS, make_setup, oracle_llm

    setup = make_setup()
    agent = setup.agent_for(oracle_llm())
    store = open_store(str(tmp_path / "oracle.db"))
    batch = collect_rollouts(
        agent, setup.environment, list(setup.tasks), setup.scorers, reward="steps", group_size=1,
        step=0, policy_version=0, store=store, max_loops=4,
    )  # fmt: skip
    assert len(batch.tapes) == len(PROBLEMS) and batch.failed == 0
    assert {len(p.operations) for p in PROBLEMS} == {1, 2, 3}  # up to three tool turns
    for tape, task in zip(batch.tapes, batch.tasks, strict=True):
        problem = next(p for p in PROBLEMS if p.id == task.id)
        results = [s for s in tape.steps if isinstance(s, ToolResult)]
        assert [r.content for r in results] == [result for *_, result in problem.steps()]
        scores = tape.metadata.result["scores"]
        assert scores["strict"] == scores["lenient"] == scores["steps"] == 1.0 and scores["digits"] > 0
        replayed = replay_tape(agent, tape, llm_calls=reconstruct_llm_calls(agent, tape))
        assert replayed.ok, replayed.diff
    store.close()


def test_lockstep_batches_wait_for_every_session_and_ignore_arrival_order() -> None:
    import asyncio

    from tapekit.llm.batched import RequestBatcher

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[list[list[int]], int | None]] = []

        def generate_batch(
            self, prompts: list[list[int]], seed: int | None
        ) -> list[tuple[list[int], list[float]]]:
            self.calls.append((prompts, seed))
            return [([p[0]], [-1.0]) for p in prompts]

    async def run(order: list[list[int]]) -> Recorder:
        batcher, llm = RequestBatcher(max_batch=2), Recorder()
        batcher.expect(len(order), seed=10)

        async def one(k: int, ids: list[int]) -> tuple[list[int], list[float]]:
            await asyncio.sleep(0.01 * k)  # arrivals spread out: max_batch must not flush early
            return await batcher.submit(llm, ids)  # type: ignore[arg-type]

        outs = await asyncio.wait_for(asyncio.gather(*(one(k, ids) for k, ids in enumerate(order))), 20)
        assert [o[0] for o in outs] == [[ids[0]] for ids in order]  # each gets its own row back
        return llm

    prompts = [[5, 1], [3], [4, 2], [3, 9], [1]]
    first = asyncio.run(run(prompts)).calls
    assert first == [([[1], [3]], 10), ([[3, 9], [4, 2]], 11), ([[5, 1]], 12)]
    assert asyncio.run(run(prompts[::-1])).calls == first


def test_one_batch_decodes_at_a_time_and_what_arrives_meanwhile_goes_in_the_next() -> None:
    import asyncio
    import threading
    import time

    from tapekit.llm.batched import RequestBatcher

    class Slow:
        def __init__(self) -> None:
            self.sizes: list[int] = []
            self.running = 0
            self.most = 0
            self.lock = threading.Lock()

        def generate_batch(
            self, prompts: list[list[int]], seed: int | None
        ) -> list[tuple[list[int], list[float]]]:
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
                self.sizes.append(len(prompts))
            time.sleep(0.3)  # a decode long enough for the others to arrive during it
            with self.lock:
                self.running -= 1
            return [([p[0]], [-1.0]) for p in prompts]

    async def run() -> Slow:
        batcher, llm = RequestBatcher(max_wait_s=0.01), Slow()

        async def one(k: int) -> tuple[list[int], list[float]]:
            await asyncio.sleep(0.0 if k == 0 else 0.05 + 0.01 * k)  # one first, then nine during its decode
            return await batcher.submit(llm, [k])  # type: ignore[arg-type]

        outs = await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(10))), 20)
        assert [o[0] for o in outs] == [[k] for k in range(10)]
        return llm

    llm = asyncio.run(run())
    assert llm.most == 1  # never two batches at once (each would take every CPU thread)
    assert llm.sizes == [1, 9]  # the nine that came during the first decode: one batch


def test_rollouts_do_not_depend_on_timing_even_with_a_task_drawn_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import random

    from tapekit import open_store
    from tapekit.llm.batched import BatchedTransformersLLM, RequestBatcher
    from tapekit.training.rl import collect_rollouts, rollout_rows
    from tests.training.rl_toy import make_model, make_setup

    submit = RequestBatcher.submit
    jitter = random.Random()

    async def late_submit(self: Any, llm: Any, ids: list[int], schema: Any = None) -> Any:
        await asyncio.sleep(jitter.random() * 0.005)  # another arrival order each run
        return await submit(self, llm, ids, schema)

    monkeypatch.setattr(RequestBatcher, "submit", late_submit)
    model, tokenizer = make_model()
    setup = make_setup()
    task = setup.tasks[0]
    seen = []
    for run in range(3):
        jitter.seed(run)
        llm = BatchedTransformersLLM.from_model(model, tokenizer, temperature=1.0, max_tokens=8)
        llm.policy_version = "0"
        store = open_store(str(tmp_path / f"r{run}.db"))
        batch = collect_rollouts(
            setup.agent_for(llm),
            setup.environment,
            [task, setup.tasks[1], task],  # the same task twice: 8 interchangeable attempts
            setup.scorers,
            reward="digits",
            group_size=4,
            step=0,
            policy_version=0,
            store=store,
            max_loops=2,
            batcher=llm.batcher,
            seed=3,
        )
        rows = rollout_rows(batch, store, tokenizer, exact=True)
        seen.append([(r["task_id"], r["input_ids"], r["logprobs"], r["reward"]) for r in rows])
        store.close()
    assert seen[0] == seen[1] == seen[2]
    assert len({tuple(r[1]) for r in seen[0]}) > 4  # the attempts differ: the order is not trivial


def test_rl_tapes_resume_and_replay_like_any_tape(tmp_path: Path) -> None:
    from tapekit import open_store, replay_tape
    from tapekit.batch import batch as run_batch
    from tapekit.llm import ReplayLLM
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_model, make_setup

    model, tokenizer = make_model()
    setup = make_setup()
    store = open_store(str(tmp_path / "rollouts.db"))
    train_rl(setup, model, tokenizer, _config(tmp_path, {"max_loops": 4}, steps=1), store=store)
    ids = store.list_tapes(where=TapeFilter(tag="rl:rl:step:0"))
    tapes = [store.get_tape(i) for i in ids]
    tape = max(tapes, key=len)  # the longest rollout
    calls = [store.get_llm_call(s.metadata.prompt_id) for s in tape.steps if s.metadata.prompt_id]
    calls = [c for c in {c.prompt.id: c for c in calls if c is not None}.values()]
    assert calls and all(c.tokens is not None and c.tokens.policy_version == "0" for c in calls)
    agent = setup.agent_for(ReplayLLM(calls=calls))
    replayed = replay_tape(agent, tape, llm_calls=calls)
    assert replayed.ok, replayed.diff
    # resume: cut the rollout after its last observation and continue it in a batch
    cut = max(i for i, s in enumerate(tape.steps) if not s.metadata.agent) + 1
    prefix = tape.model_copy(update={"steps": tape.steps[:cut]})
    (resumed,) = run_batch(agent, setup.environment, [prefix], store=store, name="resume", max_loops=4)
    assert resumed.ok, resumed.error
    assert [s.model_dump(exclude={"metadata"}) for s in resumed.tape.steps] == [
        s.model_dump(exclude={"metadata"}) for s in tape.steps
    ]
    store.close()


def test_sync_runs_repeat_exactly_and_async_bounds_the_lag(tmp_path: Path) -> None:
    import torch

    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_model, make_setup

    runs = []
    for name in ("a", "b"):
        model, tokenizer = make_model()
        result = train_rl(make_setup(), model, tokenizer, _config(tmp_path / name))
        runs.append(
            (model, [{k: v for k, v in r.to_log().items() if k not in TIMING} for r in result.history])
        )
    (model_a, records_a), (model_b, records_b) = runs
    assert records_a == records_b
    assert all(torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True))
    fresh, _ = make_model()
    assert not all(torch.equal(a, b) for a, b in zip(model_a.parameters(), fresh.parameters(), strict=True))
    assert all(r["policy_lag"] == 0 for r in records_a)  # the log lines
    assert {"reward_mean", "zero_adv_share", "clip_fraction", "kl", "sampler_probs", "score_strict"} <= set(
        records_a[0]
    )
    model, tokenizer = make_model()
    result = train_rl(make_setup(), model, tokenizer, _config(tmp_path / "c", steps=4, mode="async"))
    assert [r.step for r in result.history] == [1, 2, 3, 4]
    assert all(0 <= r.policy_lag <= 1 for r in result.history) and result.refused == 0
    assert any(r.policy_lag == 1 for r in result.history)  # the producer ran ahead


def test_a_run_killed_between_its_first_log_line_and_checkpoint_resumes_with_each_step_logged_once(
    tmp_path: Path,
) -> None:
    """The log line of a step is written before its checkpoint: a run killed between the two
    has no checkpoint yet, and its resume starts over at step 0 without keeping the old line."""
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_model, make_setup

    config = _config(tmp_path, {"tasks_per_step": 2, "group_size": 2}, steps=2)
    out = Path(config.output_dir)
    out.mkdir(parents=True)
    orphan = {"step": 0, "note": "a line whose checkpoint was never written"}
    (out / "rl_log.jsonl").write_text(json.dumps(orphan) + "\n")
    model, tokenizer = make_model()
    result = train_rl(make_setup(), model, tokenizer, config.model_copy(update={"resume": True}))
    lines = [json.loads(x) for x in (out / "rl_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1] and orphan not in lines
    assert lines == [r.to_log() for r in result.history]


def test_resample_rounds_draw_as_many_tasks_as_the_step_lacks_groups_with_a_signal(tmp_path: Path) -> None:
    from dataclasses import replace

    from tapekit.store import open_store
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import digit_share, make_model, make_setup

    def one_op_only(tape: Any, task: Any) -> float:  # a signal on one category of three only
        return digit_share(tape, task) if task.category == "one-op" else 0.0

    base = make_setup()
    setup = replace(base, scorers={**base.scorers, "one_op": one_op_only}, reward="one_op")
    model, tokenizer = make_model()
    plain = train_rl(setup, model, tokenizer, _config(tmp_path / "plain", steps=2))
    assert [r.rollouts for r in plain.history] == [12, 12]  # 3 tasks x 4, zero groups kept
    model, tokenizer = make_model()
    config = _config(tmp_path / "dyn", {"resample_rounds": 2}, steps=3)
    result = train_rl(setup, model, tokenizer, config)
    store = open_store(str(tmp_path / "dyn" / "out" / "rollouts.db"))
    try:
        for record in result.history:
            ids = store.list_tapes(where=TapeFilter(tag=f"rl:rl:step:{record.policy_version}"))
            tapes = [store.get_tape(i) for i in ids]
            assert len(ids) == len(set(ids)) == record.rollouts  # no tape of a round overwrote another's
            # replay the rounds: position k of the step's draws is in each start tape's id (the parent)
            by_position: dict[int, list[Any]] = {}
            for tape in tapes:
                k = int(str(tape.metadata.parent_id).split(".")[2].removeprefix("t"))
                by_position.setdefault(k, []).append(tape.metadata.result)
            assert sorted(by_position) == list(range(len(by_position)))
            assert all(len(group) == 4 for group in by_position.values())
            start, end, rewards = 0, 3, {}  # the first round: tasks_per_step positions
            for extra in range(3):  # the first round and the 2 resample rounds
                for k in range(start, end):
                    for r in by_position[k]:
                        rewards.setdefault(r["task_id"], []).append(r["reward"])
                missing = 3 - sum(1 for v in rewards.values() if max(v) - min(v) > 1e-12)
                if extra == 2 or missing <= 0:
                    break
                start, end = end, end + missing
            assert end == len(by_position)  # each round drew exactly the groups the step lacked
    finally:
        store.close()
    assert any(r.rollouts > 12 for r in result.history)  # some step did resample


def test_merge_batches_joins_rounds_of_one_step_and_refuses_others() -> None:
    from tapekit.training.rl import RolloutBatch, live_groups, merge_batches

    first = RolloutBatch(3, 3, [], [], "strict", seconds=1.0, prompt_tokens=10, output_tokens=4, llm_calls=2)
    more = RolloutBatch(
        3, 3, [], [], "strict", seconds=0.5, prompt_tokens=6, output_tokens=3, llm_calls=1, failed=1
    )
    joined = merge_batches(first, more)
    assert (joined.seconds, joined.prompt_tokens, joined.output_tokens, joined.llm_calls, joined.failed) == (
        1.5,
        16,
        7,
        3,
        1,
    )
    assert live_groups(joined) == 0
    with pytest.raises(ValueError, match="different steps, policy versions or rewards"):
        merge_batches(first, RolloutBatch(4, 4, [], [], "strict"))


def test_groups_by_category_compare_tasks_whose_own_attempts_agree() -> None:
    # a small model's attempts at one page nearly always score alike (no GRPO signal per task);
    # grouped by category, a solved and a failed task of one kind make one group with a signal
    from tapekit import Tape
    from tapekit.training.rl import RLRunConfig, RolloutBatch, live_groups

    def tape(task: str, category: str | None, reward: float) -> Tape:
        t = Tape()
        t.metadata.result = {"task_id": task, "category": category, "reward": reward}
        return t

    tapes = [tape("a/1", "a", 1.0), tape("a/1", "a", 1.0), tape("a/2", "a", 0.0), tape("a/2", "a", 0.0)]
    tapes += [tape("b/1", "b", 0.0), tape("b/1", "b", 0.0), tape("x", None, 1.0), tape("y", None, 0.0)]
    batch = RolloutBatch(0, 0, tapes, [], "reward")
    assert live_groups(batch) == 0  # every task's attempts agree
    assert live_groups(batch, "task_id") == 0
    assert live_groups(batch, "category") == 2  # a (1 vs 0) and the uncategorised "default" (x vs y)
    with pytest.raises(ValueError, match="'task_id' or 'category'"):
        live_groups(batch, "page")
    config = RLRunConfig(grpo={"group_key": "category"})
    assert config.step_config(0).group_key == "category"
    with pytest.raises(ValueError, match=r"needs grpo\.group_key 'task_id'"):
        RLRunConfig(grpo={"group_key": "category"}, rollouts={"resample_rounds": 1})
    with pytest.raises(ValueError, match="group_key"):
        RLRunConfig(grpo={"group_key": "page"})


def _cli(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"}
    code = "import torch; torch.set_num_threads(2); from tapekit.cli import app; app()"
    return subprocess.Popen(
        [sys.executable, "-c", code, "train", "rl", str(config), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _records(out: Path) -> list[dict[str, Any]]:
    lines = (out / "rl_log.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def test_train_rl_cli_killed_mid_step_resumes_to_the_same_result(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from tapekit.testing.tiny import load_tiny
    from tapekit.training.config import load_config
    from tapekit.training.rl import RLRunConfig, train_rl
    from tests.training.rl_toy import make_model, make_setup

    make_model(tmp_path / "model")
    settings = {  # the nested shape
        "setup": "tests.training.rl_toy:make_setup",
        "model": "model",
        "steps": 5,
        "rollouts": {"tasks_per_step": 3, "group_size": 4, "max_tokens": 12, "max_loops": 2},
        "learning_rate": 3e-3,
        "seed": 2,
    }
    import yaml

    (tmp_path / "whole.json").write_text(json.dumps({**settings, "output_dir": "whole"}))
    (tmp_path / "killed.yaml").write_text(yaml.safe_dump({**settings, "output_dir": "killed"}))
    # the unbroken run, in this process (what the CLI does, without its start-up time)
    model, tokenizer = load_tiny(tmp_path / "model")
    train_rl(make_setup(), model, tokenizer, load_config(RLRunConfig, tmp_path / "whole.json"))
    model.save_pretrained(tmp_path / "whole" / "final")
    killed = _cli(tmp_path / "killed.yaml")
    log = tmp_path / "killed" / "rl_log.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 1):
        time.sleep(0.02)
    time.sleep(0.1)  # into the next step: rollouts or training, whatever is running
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    done = len(log.read_text().splitlines())
    assert 1 <= done < 5, "the run must be killed before its end"
    resumed = _cli(tmp_path / "killed.yaml", "--resume")
    out, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, out.decode()
    assert _records(tmp_path / "killed") == _records(tmp_path / "whole")
    a = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


CLOSED: list[bool] = []  # closing_setup's environments, closed


def closing_setup(reward: str = "digits") -> Any:
    """``tests.training.rl_toy.make_setup`` whose environment records being closed (a web environment
    closes its browser), for ``tapekit train rl``."""
    from tests.training.rl_toy import make_setup

    setup = make_setup(reward)
    setup.environment.close = lambda: CLOSED.append(True)
    return setup


def test_train_rl_cli_passes_setup_args_checks_them_and_closes_the_environment(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tapekit.cli import app
    from tests.training.rl_toy import make_model

    make_model(tmp_path / "model")
    base = {
        "setup": "tests.training.test_rl_loop:closing_setup",
        "model": str(tmp_path / "model"),
        "steps": 1,
    }
    base |= {"tasks_per_step": 2, "group_size": 2, "max_tokens": 8, "max_loops": 2}  # the old flat shape
    runner = CliRunner()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(
        json.dumps({**base, "setup_args": {"rewards": "steps"}, "output_dir": str(tmp_path / "w")})
    )
    failed = runner.invoke(app, ["train", "rl", str(wrong)])
    assert failed.exit_code == 2 and "does not take setup_args {'rewards': 'steps'}" in failed.output
    assert not CLOSED  # nothing was built
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps({**base, "setup_args": {"reward": "steps"}, "output_dir": str(tmp_path / "g")})
    )
    done = runner.invoke(app, ["train", "rl", str(good)])
    assert done.exit_code == 0, done.output
    assert "warning: RLRunConfig's flat keys are deprecated" in done.output  # loaded, and said so
    assert "tasks_per_step -> rollouts.tasks_per_step" in done.output and "step=0 reward=" in done.output
    record = json.loads((tmp_path / "g" / "rl_log.jsonl").read_text().splitlines()[0])
    assert record["reward_mean"] == record["score_steps"]  # the setup was built with reward="steps"
    assert CLOSED == [True]


def test_callbacks_get_typed_records_and_stop_the_run_on_a_budget(tmp_path: Path) -> None:
    from tapekit.training.callbacks import StepCallback, StepRecord, StopAfter
    from tapekit.training.rl import RLStepRecord, train_rl
    from tests.training.rl_toy import make_model, make_setup

    class Keep(StepCallback):
        def __init__(self) -> None:
            self.records: list[StepRecord] = []
            self.events: list[str] = []

        def on_begin(self, trainer: str) -> None:
            self.events.append(f"begin {trainer}")

        def on_step(self, record: StepRecord) -> bool | None:
            self.records.append(record)
            return None

        def on_end(self) -> None:
            self.events.append("end")

    keep = Keep()
    model, tokenizer = make_model()
    config = _config(tmp_path / "steps", {"tasks_per_step": 2, "group_size": 2}, steps=10)
    lines: list[dict[str, Any]] = []  # the deprecated on_step: each record's log line, as before
    with pytest.warns(DeprecationWarning, match=r"on_step=\.\.\.\) is deprecated"):
        result = train_rl(
            make_setup(), model, tokenizer, config, callbacks=[StopAfter(steps=2), keep], on_step=lines.append
        )
    assert len(result.history) == 2 and result.policy_version == 2
    assert lines == [r.to_log() for r in result.history]
    assert result.stopped is not None and "2 steps" in result.stopped
    assert keep.events == ["begin rl", "end"]
    assert [r.step for r in keep.records] == [1, 2] and all(r.trainer == "rl" for r in keep.records)
    for typed, kept in zip(keep.records, result.history, strict=True):
        assert typed is kept and isinstance(typed, RLStepRecord)  # one record: the callbacks', the result's
        assert typed.metrics == typed.to_log() and typed.metrics["step"] == typed.step - 1
        assert typed.value("reward_mean") == typed.reward
        assert typed.value("score_strict") == typed.scores["strict"]
    written = (tmp_path / "steps" / "out" / "rl_log.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in written] == lines  # two lines, as on_step got them
    # a time budget spent by the first step stops the asynchronous run too (the producer is let go)
    model, tokenizer = make_model()
    config = _config(tmp_path / "time", {"tasks_per_step": 2, "group_size": 2}, steps=10, mode="async")
    result = train_rl(make_setup(), model, tokenizer, config, callbacks=[StopAfter(seconds=1e-6)])
    assert len(result.history) == 1 and result.stopped is not None and "s of training" in result.stopped
    # without callbacks the run does its steps
    model, tokenizer = make_model()
    config = _config(tmp_path / "all", {"tasks_per_step": 2, "group_size": 2}, steps=2)
    result = train_rl(make_setup(), model, tokenizer, config, callbacks=[StopAfter(steps=5)])
    assert len(result.history) == 2 and result.stopped is None


class _Tracker:
    """A stand-in for a transformers tracker integration: it keeps what it is given."""

    logged: list[tuple[int, dict[str, float]]] = []
    events: list[str] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.events.append(f"begin {args.output_dir}")

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self.logged.append((state.global_step, logs))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.events.append("end")


def test_rl_reports_each_step_to_the_trackers_of_report_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.integrations.integration_utils as integrations

    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_model, make_setup

    monkeypatch.setitem(integrations.INTEGRATION_TO_CALLBACK, "tensorboard", _Tracker)
    _Tracker.logged, _Tracker.events = [], []
    model, tokenizer = make_model()
    config = _config(tmp_path, {"tasks_per_step": 2, "group_size": 2}, steps=2, report_to=["tensorboard"])
    result = train_rl(make_setup(), model, tokenizer, config)
    assert _Tracker.events == [f"begin {tmp_path / 'out'}", "end"]
    assert [step for step, _ in _Tracker.logged] == [1, 2]
    for (_, logs), record in zip(_Tracker.logged, result.history, strict=True):
        assert logs["reward"] == logs["reward_mean"] == record.reward
        assert logs["score_strict"] == record.scores["strict"] and logs["loss"] == record.loss
        assert "sampler_probs/one-op" in logs and logs == record.scalars()


def test_report_to_names_a_missing_tracker_package_or_an_unknown_tracker(tmp_path: Path) -> None:
    from tapekit.training import TrainingError
    from tapekit.training.callbacks import ReportTo

    with pytest.raises(TrainingError, match="report_to: nosuch is not supported"):
        ReportTo(["nosuch"], str(tmp_path))
    if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
        with pytest.raises(TrainingError, match="report_to 'tensorboard' needs its package installed"):
            ReportTo(["tensorboard"], str(tmp_path))
    else:  # tensorboard installed: event files are written under output_dir/runs
        from tapekit.training.callbacks import StepRecord

        report = ReportTo(["tensorboard"], str(tmp_path))
        report.on_begin("rl")
        report.on_step(StepRecord(trainer="rl", step=1, seconds=1.0, step_seconds=1.0, reward=0.5))
        report.on_end()
        assert list((tmp_path / "runs").rglob("events.out.tfevents.*"))
