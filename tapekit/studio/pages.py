"""What every Studio page shares: the app's state (:class:`Studio`: the store, the agents, the
templates, a tape cache), the error page exception, and small request helpers (page numbers,
URLs, the posted form with its CSRF check) and how a route gets the app's state
(:data:`StudioDep`, a FastAPI dependency)."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

import jinja2
from fastapi import Depends, Request
from pydantic import ValidationError
from starlette.responses import HTMLResponse

from tapekit._diff import signatures
from tapekit.core import Step, Tape
from tapekit.errors import TapekitError
from tapekit.store import TapeInfo, TapeNotFoundError, TapeStore
from tapekit.studio.data import TapeCache, lenient_steps, lenient_tape, step_row
from tapekit.studio.runs import RegisteredAgent
from tapekit.studio.security import CsrfError, check_csrf

HERE = Path(__file__).parent
STEPS_PER_PAGE = 200
TAPES_PER_PAGE = 50
MAX_BATCH = 500
MAX_FORM_BYTES = 1_000_000


class PageError(TapekitError):
    """Ends a request with an error page: ``status``, a short ``title`` and a ``message``."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


def templates() -> jinja2.Environment:
    """The Jinja2 environment: autoescaping on every template, and the filters the pages use."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: all text is escaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seg"] = lambda value: quote(str(value), safe="")
    env.filters["short"] = lambda value: str(value)[:8] if value else ""
    env.filters["when"] = lambda ts: (
        datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else ""
    )
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, default=str)
    env.filters["calls"] = tool_calls
    env.filters["money"] = lambda value: f"${value:.6f}".rstrip("0").rstrip(".") if value else "$0"
    return env


def tool_calls(calls: Any) -> list[dict[str, str]]:
    """Tool calls (OpenAI message format or :class:`ToolCallRequest`) as name, id and pretty
    arguments, for display."""
    out = []
    for call in calls or []:
        data = call.model_dump() if hasattr(call, "model_dump") else dict(call)
        function = data.get("function") or data
        arguments = function.get("arguments", "")
        try:
            arguments = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
        except (TypeError, ValueError):
            arguments = str(arguments)
        out.append(
            {"name": str(function.get("name", "?")), "id": str(data.get("id", "")), "arguments": arguments}
        )
    return out


class Studio:
    """The app's state: the store, the registered agents, the templates and a tape cache."""

    def __init__(self, store: TapeStore, agents: dict[str, RegisteredAgent], max_run_loops: int) -> None:
        self.store = store
        self.agents = agents
        self.max_run_loops = max_run_loops
        self.cache = TapeCache(16)
        self.env = templates()
        self.locks: dict[str, asyncio.Lock] = {}
        """Per-tape locks of the changes that continue a stored tape in place (the chat)."""

    # ------------------------------------------------------------------ helpers

    def render(self, request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        """Template ``name`` rendered with ``context`` (and the CSRF token and agents) as the response."""
        html = self.env.get_template(name).render(
            request=request,
            csrf=request.scope.get("state", {}).get("csrf", ""),
            agents=self.agents,
            **context,
        )
        return HTMLResponse(html, status_code=code)

    def info(self, tape_id: str) -> TapeInfo:
        """The stored tape's info, or a 404 page."""
        try:
            return self.store.get_tape_info(tape_id)
        except TapeNotFoundError:
            raise PageError(
                404, "No such tape", f"There is no tape {tape_id!r} in {self.store.location}."
            ) from None

    def tape(self, info: TapeInfo) -> Tape[Any, Any]:
        """The whole tape (cached by id and length); steps of unloaded kinds shown generically."""
        key = (info.id, info.n_steps)
        tape = self.cache.get(key)
        if tape is None:
            tape = readable(
                lambda: parsed(self.store.get_tape(info.id)), lambda: lenient_tape(self.store, info)
            )
            self.cache.put(key, tape)
        return tape

    def signatures(self, info: TapeInfo) -> list[dict[str, Any]]:
        """The tape's step signatures for diffs (cached)."""
        key = ("signatures", info.id, info.n_steps)
        sigs = self.cache.get(key)
        if sigs is None:
            sigs = signatures(self.tape(info).steps)
            self.cache.put(key, sigs)
        return sigs

    def steps(self, info: TapeInfo, start: int, stop: int) -> list[Step]:
        """Steps ``start:stop``, from the cached tape if there is one, else from the store."""
        tape = self.cache.get((info.id, info.n_steps))
        if tape is not None:
            return list(tape.steps[start:stop])
        return readable(
            lambda: self.store.get_steps(info.id, start, stop),
            lambda: lenient_steps(self.store, info.id, start, stop),
        )

    def rows(self, info: TapeInfo, start: int, stop: int) -> list[Any]:
        """Step rows ``start:stop``; the first step of each node run shows its LLM tokens."""
        lo = max(start - 1, 0)
        steps = self.steps(info, lo, stop)
        prev = steps[0].metadata.prompt_id if start > 0 and steps else None
        rows = []
        for i, step in enumerate(steps[start - lo :], start):
            pid = step.metadata.prompt_id
            run_start = bool(pid) and pid != prev
            call = self.store.get_llm_call(pid) if run_start else None
            rows.append(step_row(step, i, run_start, call))
            prev = pid
        return rows

    def agent_for_root(self, root: str | None) -> RegisteredAgent | None:
        """The registered agent whose root is named ``root``, if any."""
        return next((a for a in self.agents.values() if a.agent.name == root), None)


def studio_of(request: Request) -> Studio:
    """The app's :class:`Studio` (``app.state.studio``, set by ``create_app``)."""
    studio: Studio = request.app.state.studio
    return studio


StudioDep = Annotated[Studio, Depends(studio_of)]
"""A route's parameter ``studio: StudioDep`` gets the app's :class:`Studio`."""


def readable(load: Callable[[], Any], lenient: Callable[[], Any]) -> Any:
    """``load()``; if a step does not validate (its class is not imported, or changed), the
    ``lenient()`` load, which shows such steps generically (kind and raw fields)."""
    try:
        return load()
    except ValidationError:
        return lenient()


def parsed(tape: Tape[Any, Any]) -> Tape[Any, Any]:
    """``tape`` with every step parsed now (a stored tape parses its steps when they are first
    read), so a step that does not validate fails inside :func:`readable`."""
    tape.steps.to_list()
    return tape


def int_param(value: str | None, name: str, default: int, minimum: int = 1) -> int:
    """A whole-number query parameter (``default`` when absent), or a 400 page naming it."""
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise PageError(400, "Bad request", f"{name} must be a whole number, not {value!r}.") from None
    if number < minimum:
        raise PageError(400, "Bad request", f"{name} must be at least {minimum}, not {number}.")
    return number


def page_count(total: int, per_page: int) -> int:
    """How many pages ``total`` items fill (at least one)."""
    return max(1, math.ceil(total / per_page))


def page_of(index: int) -> int:
    """The page of a tape that shows step ``index``."""
    return index // STEPS_PER_PAGE + 1


def tape_url(tape_id: str, index: int | None = None) -> str:
    """The URL of a tape's page (scrolled to step ``index`` when given)."""
    url = f"/tapes/{quote(tape_id, safe='')}"
    if index is not None:
        url += f"?page={page_of(index)}#step-{index}"
    return url


async def read_form(request: Request) -> dict[str, str]:
    """The posted form (url-encoded), after the CSRF check."""
    body = await request.body()
    ctype = request.headers.get("content-type", "").split(";")[0].strip()
    if body and ctype != "application/x-www-form-urlencoded":
        raise PageError(400, "Bad request", "Forms must be posted as application/x-www-form-urlencoded.")
    if len(body) > MAX_FORM_BYTES:
        raise PageError(413, "Too large", f"The form is larger than {MAX_FORM_BYTES} bytes.")
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise PageError(400, "Bad request", "The form is not valid UTF-8.") from None
    form = {k: v[-1] for k, v in parsed.items()}
    try:
        check_csrf(request, form.get("csrf"))
    except CsrfError as e:
        raise PageError(403, "Refused", str(e)) from None
    return form


def maybe_info(store: TapeStore, tape_id: str | None) -> TapeInfo | None:
    """The info of ``tape_id`` if it is given and stored, else None."""
    if not tape_id:
        return None
    try:
        return store.get_tape_info(tape_id)
    except TapeNotFoundError:
        return None
