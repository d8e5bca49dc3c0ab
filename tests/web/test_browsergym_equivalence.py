"""The same actions on the same seeds give the same rewards in tapekit's environment and in stock
BrowserGym. Skipped, saying why, where BrowserGym is not installed (it is not a dependency:
``pip install --no-deps browsergym-core browsergym-miniwob beautifulsoup4 soupsieve "lxml<6"
pyparsing``, see docs/web.md)."""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from tapekit import Tape, main_loop
from tapekit.web import WebAction, WebEnvironment, WebObservation, parse_action, parse_axtree
from tapekit.web.miniwob import start_tape
from tapekit.web.teacher import teacher_agent
from tests.web._stock import Replay, StockEpisode, missing, page_seed, run_episode
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


def date_policy(goal: str, axtree: str) -> list[str]:
    """enter-date's actions (no teacher covers it): fill the date input with the goal's
    MM/DD/YYYY as YYYY-MM-DD, the format a date input takes, then click Submit."""
    month, day, year = re.search(r"(\d\d)/(\d\d)/(\d{4})", goal).groups()  # type: ignore[union-attr]
    lines = parse_axtree(axtree)
    date = next(x.bid for x in lines if x.role == "Date")
    submit = next(x.bid for x in lines if x.role == "button" and x.name == "Submit")
    return [f'fill("{date}", "{year}-{month}-{day}")', f'click("{submit}")']


def test_enter_date_same_bids_on_the_date_inputs_fields_and_the_same_rewards(
    env: WebEnvironment, in_browsergym: Any
) -> None:
    """A date input's month, day and year fields and its picker button carry the input's bid in
    BrowserGym's tree (Chromium gives them the input's aria-description, where BrowserGym puts
    bids): tapekit's tree shows them with the same bid (issue 46, item 13)."""
    seed = 300_000  # a seed outside the split, on a task outside it
    first = env.react(start_tape("enter-date", page_seed(seed)))
    obs = first.steps[-1]
    assert isinstance(obs, WebObservation)
    calls = date_policy(obs.goal, obs.axtree)
    tape = first
    for call in calls:
        tape = env.react(tape.append(parse_action(call)))
    rewards = [s.reward for s in tape.steps if isinstance(s, WebObservation)][1:]
    assert rewards == [0.0, 1.0]
    episode = in_browsergym("enter-date", seed, calls)
    assert episode.error == "" and episode.goal == obs.goal
    fields = [(x.bid, x.role, x.name) for x in parse_axtree(obs.axtree) if x.role in ("spinbutton", "button")]
    date_bid = calls[0].split('"')[1]
    assert fields[:4] == [
        (date_bid, "spinbutton", "Month"),
        (date_bid, "spinbutton", "Day"),
        (date_bid, "spinbutton", "Year"),
        (date_bid, "button", "Show date picker"),
    ]
    assert controls(episode.observations[0].axtree) == controls(obs.axtree)
    assert episode.rewards == rewards


# pages for the marking scripts: an open shadow root, frames, a nested shadow root, a date input
MARKING_PAGE = """<html><body><div id="box"><button>One</button>
<my-card></my-card><iframe srcdoc="<p>in a frame</p>"></iframe><span>text</span>
<iframe></iframe><input type="date"><select><option>a</option></select></div>
<script>
customElements.define("my-card", class extends HTMLElement {
  constructor() {
    super();
    this.attachShadow({mode: "open"}).innerHTML = "<p>Card</p><button>Inside</button><my-inner></my-inner>";
  }
});
customElements.define("my-inner", class extends HTMLElement {
  constructor() { super(); this.attachShadow({mode: "open"}).innerHTML = "<a href='#'>deep</a>"; }
});
</script></body></html>"""
# then the page changes: a copy of a marked element, new elements, new frames
MARKING_CHANGE = """() => {
  const box = document.getElementById("box");
  box.appendChild(box.querySelector("button").cloneNode(true));
  box.appendChild(document.createElement("my-card"));
  for (let i = 0; i < 30; i++) box.appendChild(document.createElement("iframe"));
  box.insertBefore(document.createElement("label"), box.firstChild);
}"""
ALL_BIDS = """() => {
  const out = [];
  const elements = Array.from(document.querySelectorAll("*"));
  for (let i = 0; i < elements.length; i++) {
    const el = elements[i];
    if (el.shadowRoot) elements.splice(i + 1, 0, ...el.shadowRoot.querySelectorAll("*"));
    if (el.hasAttribute("bid")) out.push(el.tagName.toLowerCase() + ":" + el.getAttribute("bid"));
  }
  return out;
}"""


def test_the_marking_scripts_give_the_same_bids() -> None:
    """tapekit's SETTLE_AND_MARK and BrowserGym's frame_mark_elements.js, each run twice on the
    same page (the page changing in between): the same bid on every element, open shadow
    roots and frames included."""
    import asyncio
    import pkgutil

    from playwright.async_api import async_playwright

    from tapekit.web._js import HTML_TAGS, SETTLE_AND_MARK
    from tapekit.web.environment import CHROMIUM_ARGS, DEFAULT_CHROMIUM

    browsergym_js = (pkgutil.get_data("browsergym.core", "javascript/frame_mark_elements.js") or b"").decode()

    async def marked(script: str, args: list[Any]) -> list[str]:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=list(CHROMIUM_ARGS))
            try:
                page = await browser.new_page()
                await page.set_content(MARKING_PAGE)
                await page.evaluate(script, args)
                await page.evaluate(MARKING_CHANGE)
                await page.evaluate(script, args)
                return list(await page.evaluate(ALL_BIDS))
            finally:
                await browser.close()

    ours = asyncio.run(marked(SETTLE_AND_MARK, [50, HTML_TAGS]))
    theirs = asyncio.run(marked(browsergym_js, ["", "bid", "standard_html"]))
    assert ours == theirs
    tags = [b.split(":")[0] for b in ours]
    assert tags.count("button") == 4 and tags.count("a") == 2  # in the shadow roots too
    assert "iframe:a" in ours and "iframe:aA" in ours  # the 1st and the 27th frame
    assert len(set(ours)) == len(ours)  # the copied button got a bid of its own


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
