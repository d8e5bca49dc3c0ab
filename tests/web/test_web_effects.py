"""Web actions that act on the outside world (docs/durability.md, "Web actions"): a form submit a
task declares ``once`` is never replayed to rebuild a page, and in a stored session it is
journalled, so a crash after it leaves it in doubt instead of submitting it again. The outside
world is a real HTTP server whose POSTs go to a ledger; the agent is scripted (no model)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from tapekit import Agent, InDoubtToolCall, Node, SetNextNode, StopStep, Tape, main_loop
from tapekit.environment import environment_failure
from tapekit.human import resolve_in_doubt, waiting_on
from tapekit.store import SQLiteStore
from tapekit.web import (
    Click,
    Fill,
    Noop,
    OpenTask,
    PageTask,
    Press,
    SendMsgToUser,
    WebElement,
    WebEnvironment,
    WebObservation,
    WebTask,
    _procs,
    parse_axtree,
    submits_form,
)
from tests.web.conftest import needs_browser

FORM = """<!DOCTYPE html><html><head><title>Shop</title></head><body><h1>Shop</h1>
<form method="post" action="/order"><label for="item">Item</label><input id="item" name="item">
<button type="submit">Place order</button></form></body></html>"""


class Shop:
    """A site whose orders are real: every POST /order is written to ``ledger``."""

    def __init__(self) -> None:
        self.ledger: list[str] = []
        shop = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._send(FORM)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                item = parse_qs(body).get("item", [""])[0]
                shop.ledger.append(item)
                self._send(f"<html><head><title>Ordered</title></head><body><p>Order placed: {item}</p>")

            def _send(self, html: str) -> None:
                data = html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def tasks(self) -> list[WebTask]:
        """The shop with its submits declared once, and the same page declared read."""
        return [
            PageTask("shop", self.url, "Order a book", once=submits_form),
            PageTask("shop-read", self.url, "Order a book"),
        ]


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    site = Shop()
    yield site
    site.server.shutdown()
    site.server.server_close()


@pytest.fixture
def ledger(shop: Shop) -> list[str]:
    shop.ledger.clear()
    return shop.ledger


def last(tape: Tape[Any, Any]) -> WebObservation:
    return [s for s in tape.steps if isinstance(s, WebObservation)][-1]


def bid(obs: WebObservation, role: str) -> str:
    return next(x.bid for x in parse_axtree(obs.axtree) if x.role == role)


def kill_browser(env: WebEnvironment) -> None:
    pid = env.browser_pids()[0]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _procs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def order(env: WebEnvironment, task: str) -> Tape[Any, Any]:
    """Open the shop, fill in the item and click "Place order"."""
    tape = env.react(Tape(steps=[OpenTask(task=task, seed=0)]))
    tape = env.react(tape.append(Fill(bid=bid(last(tape), "textbox"), text="book")))
    return env.react(tape.append(Click(bid=bid(last(tape), "button"))))


# --------------------------------------------------------------------------- declaring effects


def test_submits_form_names_the_common_once_actions() -> None:
    button = WebElement(tag="button", type="submit", text="Place order", form_action="/o", form_method="post")
    field = WebElement(tag="input", type="text", name="item", form_action="/o", form_method="post")
    assert submits_form(Click(bid="1"), button)
    assert submits_form(Press(bid="2", key_comb="Enter"), field)
    assert not submits_form(Press(bid="2", key_comb="a"), field)
    assert not submits_form(Fill(bid="2", text="book"), field)
    assert not submits_form(Click(bid="2"), field)  # clicking into a field
    assert not submits_form(Click(bid="1"), WebElement(tag="button", type="submit"))  # no form
    assert not submits_form(Click(bid="1"), WebElement(tag="button", type="button", form_method="post"))
    assert not submits_form(Click(bid="1"), WebElement(tag="button", type="submit", form_method="dialog"))
    assert not submits_form(Click(bid="1"), None)


def test_every_task_reads_unless_it_declares_effects() -> None:
    from tapekit.web.miniwob import MiniWobTask

    miniwob = MiniWobTask("click-button")
    assert not miniwob.declares_effects and miniwob.effect(Click(bid="1"), None) == "read"
    assert not PageTask("p", "about:blank").declares_effects
    declared = PageTask("p", "about:blank", once=submits_form)
    button = WebElement(tag="button", type="submit", form_method="post")
    assert declared.declares_effects and declared.effect(Click(bid="1"), button) == "once"

    class Site(WebTask):
        name = "site"

        async def setup(self, page: Any, seed: int, timeout_s: float) -> str:
            return ""

        def effect(self, action: Any, element: WebElement | None) -> Any:
            return "once" if element is not None and element.id == "pay" else "read"

    assert Site().declares_effects


# --------------------------------------------------------------------------- the replay path


@pytest.mark.browser
@needs_browser
@pytest.mark.parametrize("lost_by", ["the browser killed", "the page evicted"])
def test_a_page_past_a_once_submit_is_not_rebuilt(shop: Shop, ledger: list[str], lost_by: str) -> None:
    with WebEnvironment(shop.tasks(), max_concurrent=1, max_open=1, prewarm=0, timeout_s=15) as env:
        tape = order(env, "shop")
        submitted = last(tape)
        assert "Order placed: book" in submitted.axtree and submitted.metadata.other["once"] is True
        assert ledger == ["book"]
        if lost_by == "the browser killed":
            kill_browser(env)
        else:  # max_open=1: another episode's page closes this one
            env.react(Tape(steps=[OpenTask(task="shop-read", seed=0)]))
        after = env.react(tape.append(Noop(wait_ms=0)))
    ended = last(after)
    assert ledger == ["book"]  # the replay did not order again
    assert ended.done and ended.truncated
    why = environment_failure(after)
    assert why == ended.last_action_error
    assert why is not None and "replaying would repeat a once action" in why and 'click("' in why


@pytest.mark.browser
@needs_browser
def test_a_page_of_read_actions_is_still_replayed(shop: Shop, ledger: list[str]) -> None:
    """The same page declared read (as every MiniWob++ task is) replays as before: the replay
    submits the form again, which is what declaring it once prevents."""
    with WebEnvironment(shop.tasks(), max_concurrent=1, prewarm=0, timeout_s=15) as env:
        tape = order(env, "shop-read")
        assert "once" not in last(tape).metadata.other and ledger == ["book"]
        kill_browser(env)
        after = env.react(tape.append(Noop(wait_ms=0)))
    obs = last(after)
    assert not obs.done and environment_failure(after) is None
    # relaunched and replayed before the step, or during it if the pool had not yet seen the kill
    assert obs.metadata.other.get("replayed") or "browser crashed" in obs.last_action_error
    assert "Order placed: book" in obs.axtree
    assert ledger == ["book", "book"]


# --------------------------------------------------------------------------- the live path


class Shopper(Node):
    """Fill in the item, place the order, say so; stop once the episode is over."""

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: Any) -> Iterator[Any]:
        obs = next((s for s in reversed(tape.steps) if isinstance(s, WebObservation)), None)
        if obs is None or obs.done:
            yield StopStep(reason="episode over")
            return
        yield SetNextNode(next_node=self.name)
        if obs.step == 0:
            yield Fill(bid=bid(obs, "textbox"), text="book")
        elif obs.step == 1:
            yield Click(bid=bid(obs, "button"))
        else:
            yield SendMsgToUser(text="ordered")


class Killed(BaseException):
    """The process dying (not an Exception: nothing on the way catches it)."""


@pytest.fixture(scope="module")
def browsers(shop: Shop) -> Iterator[tuple[WebEnvironment, WebEnvironment]]:
    """The crashed process's browser (its pages stay open) and another process's."""
    with (
        WebEnvironment(shop.tasks(), max_concurrent=1, prewarm=0, timeout_s=15) as first,
        WebEnvironment(shop.tasks(), max_concurrent=1, prewarm=0, timeout_s=15) as other,
    ):
        yield first, other


@pytest.mark.browser
@needs_browser
@pytest.mark.parametrize(
    ("decision", "resumed_in"),
    [("done", "the same browser"), ("done", "another browser"), ("retry", "another browser")],
)
def test_a_session_killed_between_the_submit_and_its_outcome_waits_in_doubt(
    tmp_path: Path,
    browsers: tuple[WebEnvironment, WebEnvironment],
    ledger: list[str],
    decision: str,
    resumed_in: str,
) -> None:
    first, other = browsers
    agent = Agent.create("shopper", nodes=[Shopper(name="shop")])
    start = Tape(steps=[OpenTask(task="shop", seed=0)])
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        record = store._record_effect

        def dies_before_the_outcome(
            key: str, tape_id: str, tool: str, arguments: Any, state: str, *rest: Any
        ) -> None:
            if state != "started":
                raise Killed
            record(key, tape_id, tool, arguments, state, *rest)

        store._record_effect = dies_before_the_outcome  # type: ignore[method-assign]
        with pytest.raises(Killed):
            main_loop(agent, start, first, store=store).get_final_tape()
    assert ledger == ["book"]  # the order reached the shop; its outcome was never written

    with SQLiteStore(path) as store:  # the next process
        cut = store.get_tape(start.metadata.id)
        click = cut.steps[-1]
        assert isinstance(click, Click)
        waits = [e.external for e in main_loop(agent, cut, other, store=store) if e.external is not None]
        assert ledger == ["book"]  # not ordered again
        assert len(waits) == 1 and isinstance(waits[0], InDoubtToolCall), waits
        assert "may or may not have run" in str(waits[0]) and waits[0].action is click
        (doubt,) = store.tool_effects(in_doubt=True)
        assert doubt.key == click.metadata.id and doubt.tool == "browser.click"
        assert doubt.arguments["action"] == click.call()

        # what the chat page and `tapekit chat` show, and how they settle it (a person's word)
        waiting = waiting_on(cut, None, store)
        assert waiting is not None and waiting.kind == "in_doubt"
        assert [e.tool for e in waiting.effects] == ["browser.click"]
        resolve_in_doubt(store, doubt.key, decision, "ordered" if decision == "done" else "")
        env = first if resumed_in == "the same browser" else other
        final = main_loop(agent, store.get_tape(start.metadata.id), env, store=store).get_final_tape()

    assert final.metadata.error is None and isinstance(final.steps[-1], StopStep)
    answer = next(s for s in final.steps[len(cut) :] if isinstance(s, WebObservation))
    assert answer.metadata.other["once"] is True
    if decision == "retry":  # a person said it did not happen: ordered again, by their word
        assert ledger == ["book", "book"] and "Order placed: book" in answer.axtree
        assert "effect" not in answer.metadata.other
    elif resumed_in == "the same browser":  # goes on from the page as it is
        assert ledger == ["book"] and answer.metadata.other["effect"] == "reused"
        assert "Order placed: book" in answer.axtree and not answer.done
        assert isinstance(final.steps[-3], SendMsgToUser)
    else:  # its page is gone and cannot be rebuilt without ordering again
        assert ledger == ["book"] and answer.done
        assert "replaying would repeat a once action" in answer.last_action_error


@pytest.mark.browser
@needs_browser
@pytest.mark.parametrize("died", ["after the submit", "before the submit"])
def test_the_task_reconciles_an_action_in_doubt_by_asking_the_site(
    tmp_path: Path, shop: Shop, ledger: list[str], died: str
) -> None:
    """A task with ``reconcile`` looks the order up in the shop instead of waiting for a person:
    found, it is done (not ordered again); not found, it is done now, once."""
    from tapekit.effects import NOT_DONE

    asked: list[str] = []

    def look_up(action: Any, effect: Any) -> Any:
        asked.append(effect.key)
        return {"order": "book"} if "book" in shop.ledger else NOT_DONE

    tasks: list[WebTask] = [PageTask("shop", shop.url, "Order a book", once=submits_form, reconcile=look_up)]
    agent = Agent.create("shopper", nodes=[Shopper(name="shop")])
    start = Tape(steps=[OpenTask(task="shop", seed=0)])
    path = tmp_path / "s.db"
    with WebEnvironment(tasks, max_concurrent=1, prewarm=0, timeout_s=15) as env, SQLiteStore(path) as store:
        record = store._record_effect

        def dies(key: str, tape_id: str, tool: str, arguments: Any, state: str, *rest: Any) -> None:
            if state == "started" and died == "before the submit":
                record(key, tape_id, tool, arguments, state, *rest)  # the intent, then the crash
                raise Killed
            if state != "started":
                raise Killed  # the order went out, its outcome was never written
            record(key, tape_id, tool, arguments, state, *rest)

        store._record_effect = dies  # type: ignore[method-assign]
        with pytest.raises(Killed):
            main_loop(agent, start, env, store=store).get_final_tape()
    assert ledger == (["book"] if died == "after the submit" else [])

    with (
        WebEnvironment(tasks, max_concurrent=1, prewarm=0, timeout_s=15) as other,
        SQLiteStore(path) as store,
    ):
        events = list(main_loop(agent, store.get_tape(start.metadata.id), other, store=store))
        assert not [e.external for e in events if e.external is not None]  # nobody was asked
        final = store.get_tape(start.metadata.id)
        (effect,) = store.tool_effects()
    assert ledger == ["book"]  # exactly one order either way
    assert len(asked) == 1 and effect.state == "done"
    answer = next(s for s in final.steps if isinstance(s, WebObservation) and s.step == 2)
    assert answer.metadata.other["once"] is True
    if died == "after the submit":  # found in the shop: kept as the outcome; the page is gone here
        assert effect.result == {"order": "book"}
        assert answer.done and "replaying would repeat a once action" in answer.last_action_error
    else:  # not found: ordered now
        assert "Order placed: book" in answer.axtree and not answer.done


def test_reconcile_needs_once_actions() -> None:
    with pytest.raises(ValueError, match="declare them with once="):
        PageTask("p", "about:blank", reconcile=lambda action, effect: None)
