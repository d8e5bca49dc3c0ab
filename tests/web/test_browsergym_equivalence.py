"""The same actions on the same seeds give the same rewards in tapekit's environment and in stock
BrowserGym. Skipped, saying why, where BrowserGym is not installed (it is not a dependency:
``pip install --no-deps browsergym-core browsergym-miniwob beautifulsoup4 soupsieve "lxml<6"
pyparsing``, see docs/web.md)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from tapekit import Tape, main_loop
from tapekit.web import WebAction, WebEnvironment, WebObservation, parse_action, parse_axtree
from tapekit.web.miniwob import start_tape
from tapekit.web.stock import Replay, StockEpisode, missing, page_seed, run_episode
from tapekit.web.teacher import teacher_agent
from tests.web.conftest import MISSING

REASON = "; ".join(MISSING) or missing()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

# (task, BrowserGym seed): one of each kind of interaction the teacher uses
CASES = [
    ("click-link", 0),
    ("login-user", 1),
    ("click-checkboxes", 2),
    ("choose-list", 3),
    ("use-autocomplete", 4),
    ("navigate-tree", 5),
    ("email-inbox", 6),
]


@pytest.fixture(scope="module")
def env() -> Any:
    with WebEnvironment(max_concurrent=1, timeout_s=30) as environment:
        yield environment


@pytest.fixture(scope="module")
def in_browsergym() -> Iterator[Any]:
    """Runs stock BrowserGym episodes in a worker process: BrowserGym keeps a process-wide sync
    Playwright that would otherwise outlive the tests in this one."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:

        def run(task: str, seed: int, calls: list[str]) -> StockEpisode:
            return pool.submit(run_episode, task, seed, Replay(tuple(calls))).result(timeout=300)

        yield run


def controls(axtree: str) -> list[tuple[str, str, str]]:
    return [(x.bid, x.role, x.name) for x in parse_axtree(axtree) if x.bid]


def tapekit_run(env: WebEnvironment, tape: Tape[Any, Any]) -> tuple[list[str], list[float], list[str]]:
    obs = [s for s in tape.steps if isinstance(s, WebObservation)]
    calls = [s.call() for s in tape.steps if isinstance(s, WebAction)]
    return calls, [o.reward for o in obs[1:]], [o.axtree for o in obs]


@pytest.mark.parametrize(("task", "seed"), CASES)
def test_teacher_actions_earn_the_same_rewards_in_stock_browsergym(
    env: WebEnvironment, in_browsergym: Any, task: str, seed: int
) -> None:
    tape = main_loop(teacher_agent(), start_tape(task, page_seed(seed)), env).get_final_tape()
    calls, rewards, trees = tapekit_run(env, tape)
    assert rewards[-1] == 1.0
    episode = in_browsergym(task, seed, calls)
    assert episode.error == ""
    assert episode.goal == tape.steps[1].goal  # the same page seed gives the same problem
    # the same bids on the same controls (BrowserGym writes bids into ARIA attributes, which
    # shifts some text nodes of its tree; the lines that carry a bid must agree)
    assert controls(episode.observations[0].axtree) == controls(trees[0])
    assert episode.actions == calls
    assert episode.rewards == rewards


def test_a_wrong_action_earns_nothing_in_both(env: WebEnvironment, in_browsergym: Any) -> None:
    seed = page_seed(7)
    first = env.react(start_tape("click-button", seed))
    obs = first.steps[-1]
    assert isinstance(obs, WebObservation)
    target = obs.goal.split('"')[1]
    wrong = next(
        line.split("]")[0].lstrip(" [")
        for line in obs.axtree.splitlines()
        if " button " in line and f'"{target}"' not in line
    )
    done = env.react(first.append(parse_action(f'click("{wrong}")')))
    reward = done.steps[-1].reward  # type: ignore[attr-defined]
    episode = in_browsergym("click-button", 7, [f'click("{wrong}")'])
    assert reward == 0.0 and episode.rewards == [0.0]
