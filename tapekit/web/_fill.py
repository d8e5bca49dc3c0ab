"""What a ``fill`` left in its field: the environment reads the field's value back after a fill and
calls the fill an error when the field does not hold the text given (:func:`fill_problem`)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["FIELD_VALUE", "FILL_FORMATS", "fill_problem"]

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
