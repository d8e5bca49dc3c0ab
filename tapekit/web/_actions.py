"""Web actions done on a Playwright page (:func:`perform`), and the check that a ``fill`` took: the
field's value is read back after a fill, and a field that does not hold the text given makes
the fill an error (:func:`fill_problem`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from tapekit.environment import UnknownActionError
from tapekit.web.steps import (
    Click,
    Fill,
    GoBack,
    Hover,
    Noop,
    Press,
    Scroll,
    SelectOption,
    SendMsgToUser,
    WebAction,
)

Guard = Callable[[Coroutine[Any, Any, Any], str], Awaitable[Any]]
"""Runs one browser call under its deadline, named for the error (``BrowserPool.guard``)."""

# what a filled field holds: an input's or a textarea's value (None for other elements, e.g. a
# contenteditable, whose text the browser may lay out differently from what was typed)
FIELD_VALUE = """el => {
  const tag = el.tagName.toLowerCase();
  if (tag !== 'input' && tag !== 'textarea') return null;
  return {value: el.value, type: tag === 'input' ? (el.type || 'text').toLowerCase() : tag,
          maxLength: el.maxLength};
}"""

FILL_FORMATS: dict[str, str] = {
    "date": "YYYY-MM-DD (e.g. 2016-11-07)",
    "time": "HH:MM, 24-hour (e.g. 14:05)",
    "datetime-local": "YYYY-MM-DDTHH:MM (e.g. 2016-11-07T14:05)",
    "month": "YYYY-MM (e.g. 2016-11)",
    "week": "YYYY-Www (e.g. 2016-W45)",
    "number": "a number (e.g. 42 or -3.5)",
    "range": "a number within the slider's range",
    "color": "#rrggbb (e.g. #ff0000)",
}
"""The value format of the input types that refuse other text: a ``fill`` of a date input with
``11/07/2016`` leaves it empty (in BrowserGym too, silently); tapekit's observation says so and
names the format."""

_ONE_LINE = frozenset({"text", "search", "tel", "url", "email", "password"})  # drop line breaks


def fill_problem(text: str, held: dict[str, Any] | None) -> str:
    """Why a ``fill`` of ``text`` did not take, from what the field holds after it (``held``:
    its ``value``, ``type`` and ``maxLength``); '' when it took (or the element is no input).

    The browser's own clean-up of a value is not a problem: a one-line input drops line breaks,
    an email or URL input trims spaces, a textarea writes ``\r\n`` as ``\n``.
    """
    if not held:
        return ""
    value, kind = str(held.get("value") or ""), str(held.get("type") or "text")
    expected = text.replace("\r\n", "\n")
    if kind in _ONE_LINE:
        expected = expected.replace("\r", "").replace("\n", "")
    if kind in ("email", "url"):
        expected = expected.strip()
    if value == expected:
        return ""
    problem = f"the {kind} field holds {json.dumps(value, ensure_ascii=False)}, not the text given"
    if kind in FILL_FORMATS:
        problem += f"; a {kind} input takes {FILL_FORMATS[kind]}"
    limit = held.get("maxLength")
    if isinstance(limit, int) and 0 <= limit < len(expected):
        problem += f"; it keeps at most {limit} characters"
    return problem


async def perform(
    page: Any, action: WebAction, guard: Guard, *, action_timeout_s: float, timeout_s: float, name: str
) -> None:
    """Do ``action`` on ``page`` (a Playwright async page), every browser call under ``guard``.
    The page's refusals raise: Playwright's errors (an element not actionable within
    ``action_timeout_s``), ``ValueError`` for a bid not on the page or a fill that did not take;
    an action this function does not know raises :class:`~tapekit.environment.UnknownActionError`
    naming ``name``."""
    t = action_timeout_s * 1000
    if isinstance(action, Click | Fill | SelectOption | Press | Hover):
        locator = page.locator(f'[bid="{action.bid}"]')
        count = await guard(locator.count(), action.call())
        if count == 0:
            raise ValueError(f'Could not find element with bid "{action.bid}"')
        if isinstance(action, Click):
            await guard(locator.click(timeout=t), action.call())
        elif isinstance(action, Fill):
            await guard(locator.fill(action.text, timeout=t), action.call())
            held = await guard(locator.evaluate(FIELD_VALUE), action.call())
            problem = fill_problem(action.text, held)
            if problem:
                raise ValueError(f"{action.call()} did not take: {problem}")
        elif isinstance(action, SelectOption):
            await guard(locator.select_option(action.options, timeout=t), action.call())
        elif isinstance(action, Press):
            await guard(locator.press(action.key_comb, timeout=t), action.call())
        else:
            await guard(locator.hover(timeout=t), action.call())
    elif isinstance(action, Scroll):
        await guard(page.mouse.wheel(action.dx, action.dy), action.call())
    elif isinstance(action, GoBack):
        await guard(page.go_back(timeout=timeout_s * 1000), action.call())
    elif isinstance(action, Noop):
        await asyncio.sleep(max(0.0, min(action.wait_ms, timeout_s * 1000 - 1)) / 1000)
    elif isinstance(action, SendMsgToUser):
        pass  # the final answer: nothing to do on the page
    else:
        raise UnknownActionError(f"{name} cannot perform {action.kind!r}")
