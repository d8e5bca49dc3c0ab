"""The Studio web app: browse, diff, edit and resume the tapes of a tape store.

Server-rendered HTML (Jinja2 with autoescaping on every template) plus one small vanilla-JS file
that loads step details in place. Pages have stable URLs and work when opened directly:

- ``/tapes``: the tapes, filtered by author, agent, error and tag, 50 to a page;
- ``/tapes/{id}``: one tape, 200 steps to a page, colour-coded by kind category;
- ``/tapes/{id}/steps/{index}``: the same page with the step's details: its JSON, the exact
  prompt and output of the LLM call behind it (tokens, cost, latency), the tape view stack at
  that step, and forms to edit or delete it;
- ``/diff?a=ID&b=ID``: two tapes side by side, the first divergence highlighted;
- ``/diff/batches?a=tag:X&b=tag:Y``: two batches of tapes paired by how they started;
- ``/runs``: step or run a registered agent on a tape.

Nothing changes a stored tape: edits and runs save a new child tape (``parent_id`` = the tape
it came from) and redirect to it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import jinja2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from tapekit._diff import first_divergence, signatures
from tapekit.core import Step, Tape
from tapekit.errors import TapekitError
from tapekit.store import TapeInfo, TapeNotFoundError, TapeStore, open_store
from tapekit.studio.data import (
    TapeCache,
    batch_pairs,
    diff_rows,
    lenient_steps,
    lenient_tape,
    root_agent_name,
    step_author,
    step_row,
    view_infos,
)
from tapekit.studio.runs import (
    AgentSource,
    NothingToDoError,
    RegisteredAgent,
    StepInputError,
    advance,
    appended_tape,
    edited_tape,
    load_agents,
    next_actor,
    parse_step,
    truncated_tape,
)
from tapekit.studio.security import CsrfError, SecurityMiddleware, check_csrf, is_loopback

__all__ = ["STEPS_PER_PAGE", "TAPES_PER_PAGE", "create_app", "serve", "serve_in_thread"]

logger = logging.getLogger(__name__)

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


def _templates() -> jinja2.Environment:
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
    env.filters["calls"] = _tool_calls
    env.filters["money"] = lambda value: f"${value:.6f}".rstrip("0").rstrip(".") if value else "$0"
    return env


def _tool_calls(calls: Any) -> list[dict[str, str]]:
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


class _Studio:
    """The app's state: the store, the registered agents, the templates and a tape cache."""

    def __init__(self, store: TapeStore, agents: dict[str, RegisteredAgent], max_run_loops: int) -> None:
        self.store = store
        self.agents = agents
        self.max_run_loops = max_run_loops
        self.cache = TapeCache(16)
        self.env = _templates()

    # ------------------------------------------------------------------ helpers

    def render(self, request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(
            request=request,
            csrf=request.scope.get("state", {}).get("csrf", ""),
            agents=self.agents,
            **context,
        )
        return HTMLResponse(html, status_code=code)

    def info(self, tape_id: str) -> TapeInfo:
        try:
            return self.store.get_tape_info(tape_id)
        except TapeNotFoundError:
            raise PageError(
                404, "No such tape", f"There is no tape {tape_id!r} in {self.store.location}."
            ) from None

    def tape(self, info: TapeInfo) -> Tape[Any, Any]:
        key = (info.id, info.n_steps)
        tape = self.cache.get(key)
        if tape is None:
            tape = _readable(lambda: self.store.get_tape(info.id), lambda: lenient_tape(self.store, info))
            self.cache.put(key, tape)
        return tape

    def signatures(self, info: TapeInfo) -> list[dict[str, Any]]:
        key = ("signatures", info.id, info.n_steps)
        sigs = self.cache.get(key)
        if sigs is None:
            sigs = signatures(self.tape(info).steps)
            self.cache.put(key, sigs)
        return sigs

    def steps(self, info: TapeInfo, start: int, stop: int) -> list[Step]:
        tape = self.cache.get((info.id, info.n_steps))
        if tape is not None:
            return list(tape.steps[start:stop])
        return _readable(
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
        return next((a for a in self.agents.values() if a.agent.name == root), None)


def _readable(load: Callable[[], Any], lenient: Callable[[], Any]) -> Any:
    """``load()``; if a step does not validate (its class is not imported, or changed), the
    ``lenient()`` load, which shows such steps generically (kind and raw fields)."""
    try:
        return load()
    except ValidationError:
        return lenient()


def _int(value: str | None, name: str, default: int, minimum: int = 1) -> int:
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise PageError(400, "Bad request", f"{name} must be a whole number, not {value!r}.") from None
    if number < minimum:
        raise PageError(400, "Bad request", f"{name} must be at least {minimum}, not {number}.")
    return number


def _pages(total: int, per_page: int) -> int:
    return max(1, math.ceil(total / per_page))


def _page_of(index: int) -> int:
    return index // STEPS_PER_PAGE + 1


def _tape_url(tape_id: str, index: int | None = None) -> str:
    url = f"/tapes/{quote(tape_id, safe='')}"
    if index is not None:
        url += f"?page={_page_of(index)}#step-{index}"
    return url


async def _form(request: Request) -> dict[str, str]:
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


def create_app(
    store: TapeStore,
    *,
    agents: Iterable[AgentSource] | Mapping[str, AgentSource] | None = None,
    token: str | None = None,
    max_run_loops: int = 100,
) -> FastAPI:
    """The Studio as an ASGI app over ``store``.

    ``agents`` are the agents a user may step or run (``"module:attr"`` strings, agents,
    ``(agent, environment)`` pairs, or callables returning either; a mapping names them).
    With ``token`` every request must carry it (see :mod:`tapekit.studio.security`).
    ``max_run_loops`` bounds the agent/environment rounds of one "run".
    """
    studio = _Studio(store, load_agents(agents), max_run_loops)
    app = FastAPI(title="tapekit Studio", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.studio = studio
    app.add_middleware(SecurityMiddleware, token=token)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    # ------------------------------------------------------------------ errors

    @app.exception_handler(PageError)
    async def page_error(request: Request, exc: PageError) -> Response:
        return studio.render(
            request, "error.html", exc.status, status=exc.status, title=exc.title, message=exc.message
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "Error")
        message = "There is no page at this address." if exc.status_code == 404 else str(exc.detail)
        return studio.render(
            request, "error.html", exc.status_code, status=exc.status_code, title=title, message=message
        )

    @app.exception_handler(RequestValidationError)
    async def bad_input(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or 'input'}: {err['msg']}" for err in exc.errors()
        )
        return studio.render(request, "error.html", 400, status=400, title="Bad request", message=problems)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> Response:
        logger.exception("studio request %s failed", request.url.path)
        message = f"{type(exc).__name__}: {exc}"
        return studio.render(request, "error.html", 500, status=500, title="Internal error", message=message)

    # ------------------------------------------------------------------ the tape browser

    @app.get("/", include_in_schema=False)
    def home() -> Response:
        return RedirectResponse("/tapes", status_code=303)

    @app.get("/tapes", response_class=HTMLResponse)
    def tapes(request: Request) -> Response:
        q = request.query_params
        error = q.get("error", "")
        if error not in ("", "yes", "no"):
            raise PageError(400, "Bad request", f"error must be 'yes', 'no' or empty, not {error!r}.")
        filters: dict[str, Any] = {
            "author": q.get("author") or None,
            "agent": q.get("agent") or None,
            "tag": q.get("tag") or None,
            "parent_id": q.get("parent") or None,
            "has_error": {"yes": True, "no": False}.get(error),
        }
        page = _int(q.get("page"), "page", 1)
        total = store.count_tapes(**filters)
        pages = _pages(total, TAPES_PER_PAGE)
        if page > pages:
            raise PageError(400, "Bad request", f"page {page} is past the last page ({pages}).")
        infos = store.list_tape_infos(**filters, limit=TAPES_PER_PAGE, offset=(page - 1) * TAPES_PER_PAGE)
        shown = {k: v for k, v in q.items() if k in ("author", "agent", "tag", "parent", "error") and v}
        return studio.render(
            request,
            "tapes.html",
            infos=infos,
            total=total,
            page=page,
            pages=pages,
            filters=shown,
            first=(page - 1) * TAPES_PER_PAGE,
        )

    def tape_page(request: Request, tape_id: str, step_index: int | None) -> Response:
        info = studio.info(tape_id)
        n = info.n_steps
        if step_index is not None and not 0 <= step_index < n:
            raise PageError(
                404, "No such step", f"Tape {tape_id!r} has {n} steps; there is no step {step_index}."
            )
        default = _page_of(step_index) if step_index is not None else 1
        page = _int(request.query_params.get("page"), "page", default)
        pages = _pages(n, STEPS_PER_PAGE)
        if page > pages:
            raise PageError(400, "Bad request", f"page {page} is past the last page ({pages}) of this tape.")
        detail = step_detail(info, step_index) if step_index is not None else None
        if request.query_params.get("fragment") == "1":
            if detail is None:
                raise PageError(400, "Bad request", "fragment=1 is for step pages.")
            return studio.render(request, "step_panel.html", info=info, d=detail)
        start = (page - 1) * STEPS_PER_PAGE
        children = store.list_tape_infos(parent_id=tape_id, limit=20)
        return studio.render(
            request,
            "tape.html",
            info=info,
            rows=studio.rows(info, start, min(start + STEPS_PER_PAGE, n)),
            page=page,
            pages=pages,
            parent=_maybe_info(store, info.parent_id),
            children=children,
            n_children=len(children) if len(children) < 20 else store.count_tapes(parent_id=tape_id),
            totals=store.totals("node", tape_id=tape_id),
            d=detail,
        )

    def step_detail(info: TapeInfo, index: int) -> dict[str, Any]:
        tape = studio.tape(info)
        steps = tape.steps
        step = steps[index]
        prefix = tape[: index + 1]
        root = root_agent_name(steps[: index + 1]) or root_agent_name(steps)
        registered = studio.agent_for_root(root)
        pid = step.metadata.prompt_id
        run = []
        if pid:
            lo = index
            while lo > 0 and steps[lo - 1].metadata.prompt_id == pid:
                lo -= 1
            hi = index
            while hi + 1 < len(steps) and steps[hi + 1].metadata.prompt_id == pid:
                hi += 1
            run = list(range(lo, hi + 1))
        views = view_infos(prefix, root, registered.agent if registered else None) if root else []
        after = next_actor(prefix, root) if index == len(steps) - 1 else None
        return {
            "index": index,
            "step": step,
            "row": step_row(step, index),
            "author": step_author(step),
            "json": json.dumps(step.llm_dict(), indent=2, ensure_ascii=False),
            "metadata": step.metadata.model_dump(mode="json"),
            "call": store.get_llm_call(pid) if pid else None,
            "run": run,
            "views": views,
            "next": after,
        }

    @app.get("/tapes/{tape_id}", response_class=HTMLResponse)
    def tape(request: Request, tape_id: str) -> Response:
        return tape_page(request, tape_id, None)

    @app.get("/tapes/{tape_id}/steps/{index}", response_class=HTMLResponse)
    def step(request: Request, tape_id: str, index: int) -> Response:
        return tape_page(request, tape_id, index)

    # ------------------------------------------------------------------ editing (new child tapes)

    async def save_child(child: Tape[Any, Any], first_new: int) -> Response:
        await run_in_threadpool(store.save_tape, child)
        await run_in_threadpool(store.flush)
        index = min(first_new, len(child) - 1) if len(child) else None
        return RedirectResponse(_tape_url(child.metadata.id, index), status_code=303)

    @app.post("/tapes/{tape_id}/steps/{index}/edit")
    async def edit_step(request: Request, tape_id: str, index: int) -> Response:
        form = await _form(request)
        info = await run_in_threadpool(studio.info, tape_id)
        if not 0 <= index < info.n_steps:
            raise PageError(
                404, "No such step", f"Tape {tape_id!r} has {info.n_steps} steps; there is no step {index}."
            )
        source = await run_in_threadpool(studio.tape, info)
        try:
            new = parse_step(form.get("step", ""), source.steps[index].metadata)
        except StepInputError as e:
            raise PageError(400, "Invalid step", str(e)) from None
        child = edited_tape(source, index, new, keep_rest=form.get("keep_rest") == "on")
        return await save_child(child, index)

    @app.post("/tapes/{tape_id}/steps/{index}/delete")
    async def delete_step(request: Request, tape_id: str, index: int) -> Response:
        await _form(request)
        info = await run_in_threadpool(studio.info, tape_id)
        if not 0 <= index < info.n_steps:
            raise PageError(
                404, "No such step", f"Tape {tape_id!r} has {info.n_steps} steps; there is no step {index}."
            )
        source = await run_in_threadpool(studio.tape, info)
        return await save_child(truncated_tape(source, index), index - 1)

    @app.post("/tapes/{tape_id}/append")
    async def append_step(request: Request, tape_id: str) -> Response:
        form = await _form(request)
        info = await run_in_threadpool(studio.info, tape_id)
        try:
            new = parse_step(form.get("step", ""))
        except StepInputError as e:
            raise PageError(400, "Invalid step", str(e)) from None
        source = await run_in_threadpool(studio.tape, info)
        return await save_child(appended_tape(source, new), info.n_steps)

    # ------------------------------------------------------------------ runs

    @app.get("/runs", response_class=HTMLResponse)
    def runs(request: Request) -> Response:
        return studio.render(
            request,
            "runs.html",
            recent=store.list_tape_infos(limit=50),
            selected=request.query_params.get("tape", ""),
        )

    @app.post("/runs")
    async def run(request: Request) -> Response:
        form = await _form(request)
        name, tape_id, mode = form.get("agent", ""), form.get("tape", "").strip(), form.get("mode", "")
        if not studio.agents:
            raise PageError(
                400, "No agents", "Start the Studio with --agent module:attr to step or run agents."
            )
        if name not in studio.agents:
            known = ", ".join(sorted(studio.agents))
            raise PageError(400, "Unknown agent", f"No agent {name!r} is registered (registered: {known}).")
        if mode not in ("step", "run"):
            raise PageError(400, "Bad request", f"mode must be 'step' or 'run', not {mode!r}.")
        if not tape_id:
            raise PageError(400, "Bad request", "Pick a tape to continue.")
        info = await run_in_threadpool(studio.info, tape_id)
        cached = await run_in_threadpool(studio.tape, info)
        try:
            result = await advance(
                studio.agents[name],
                cached,
                mode,  # type: ignore[arg-type]
                max_loops=studio.max_run_loops,
                store=store,
            )
        except NothingToDoError as e:
            raise PageError(409, "Nothing to do", f"{e}. Append a step to the tape, then continue.") from None
        return await save_child(result.tape, len(cached))

    # ------------------------------------------------------------------ diffs

    @app.get("/diff", response_class=HTMLResponse)
    def diff(request: Request) -> Response:
        q = request.query_params
        ids = q.getlist("id")
        a_id, b_id = q.get("a", ""), q.get("b", "")
        if ids:
            if len(ids) != 2:
                raise PageError(400, "Bad request", f"Pick exactly two tapes to compare, not {len(ids)}.")
            a_id, b_id = ids
        if not a_id or not b_id:
            return studio.render(request, "diff.html", a=None, b=None, a_id=a_id, b_id=b_id)
        a_info, b_info = studio.info(a_id), studio.info(b_id)
        a_tape, b_tape = studio.tape(a_info), studio.tape(b_info)
        longest = max(len(a_tape), len(b_tape))
        sigs = studio.signatures(a_info), studio.signatures(b_info)
        first = first_divergence(*sigs)
        default = _page_of(first) if first is not None else 1
        page = _int(q.get("page"), "page", default)
        pages = _pages(longest, STEPS_PER_PAGE)
        if page > pages:
            raise PageError(400, "Bad request", f"page {page} is past the last page ({pages}).")
        start = (page - 1) * STEPS_PER_PAGE
        rows, _ = diff_rows(a_tape.steps, b_tape.steps, start, start + STEPS_PER_PAGE, *sigs)
        return studio.render(
            request,
            "diff.html",
            a=a_info,
            b=b_info,
            a_id=a_id,
            b_id=b_id,
            rows=rows,
            first=first,
            page=page,
            pages=pages,
        )

    @app.get("/diff/batches", response_class=HTMLResponse)
    def batch_diff(request: Request) -> Response:
        q = request.query_params
        spec_a, spec_b = q.get("a", "").strip(), q.get("b", "").strip()
        if not spec_a or not spec_b:
            return studio.render(request, "batches.html", pairs=None, spec_a=spec_a, spec_b=spec_b)
        batch_a, batch_b = batch(spec_a), batch(spec_b)
        pairs = batch_pairs(
            [(i, studio.steps(i, 0, 50)) for i in batch_a], [(i, studio.steps(i, 0, 50)) for i in batch_b]
        )
        out = []
        for pair in pairs:
            if pair.a is not None and pair.b is not None:
                first = first_divergence(studio.signatures(pair.a), studio.signatures(pair.b))
                pair = type(pair)(pair.a, pair.b, pair.matched_by, first, first is None)
            out.append(pair)
        return studio.render(
            request,
            "batches.html",
            pairs=out,
            spec_a=spec_a,
            spec_b=spec_b,
            n_a=len(batch_a),
            n_b=len(batch_b),
        )

    def batch(spec: str) -> list[TapeInfo]:
        if spec.startswith("tag:"):
            tag = spec[4:].strip()
            if not tag:
                raise PageError(400, "Bad request", "Write tag:NAME, with a tag name.")
            infos = store.list_tape_infos(tag=tag, limit=MAX_BATCH + 1)
            if len(infos) > MAX_BATCH:
                raise PageError(
                    400, "Too many tapes", f"Tag {tag!r} has over {MAX_BATCH} tapes; compare fewer."
                )
            infos.reverse()  # oldest first: the order the batch ran in
            return infos
        ids = [part for part in re.split(r"[\s,]+", spec) if part]
        if len(ids) > MAX_BATCH:
            raise PageError(400, "Too many tapes", f"Compare at most {MAX_BATCH} tapes per batch.")
        return [studio.info(i) for i in ids]

    from tapekit.studio.chat import add_chat_routes

    add_chat_routes(app, studio)
    return app


def _maybe_info(store: TapeStore, tape_id: str | None) -> TapeInfo | None:
    if not tape_id:
        return None
    try:
        return store.get_tape_info(tape_id)
    except TapeNotFoundError:
        return None


def serve(
    db: str | Path,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    agents: Iterable[AgentSource] | Mapping[str, AgentSource] | None = None,
    *,
    create: bool = False,
    imports: Iterable[str] = (),
) -> None:
    """Serve the Studio over the store at ``db`` (an SQLite path or a ``postgresql://`` URL)
    until interrupted.

    An SQLite file must exist unless ``create`` is true (a typo then fails instead of serving an
    empty new store). ``imports`` are modules to import first: those that define the step
    classes of the stored tapes (steps of kinds no imported module declares are shown
    generically, by kind and raw fields). Bound to anything but a loopback address the Studio is
    reachable from other machines, so it then needs a token: without one, a random token is made
    and printed with the URL to open. What is printed is flushed at once (for pipes and service
    managers).
    """
    import importlib
    import secrets

    import uvicorn

    check_store_exists(db, create)
    for module in imports:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"--import {module}: cannot import it: {e}") from e
    if not is_loopback(host) and not token:
        token = secrets.token_urlsafe(24)
        print(f"the Studio is bound to {host}, so it needs a token; made one: {token}", flush=True)
    with open_store(db, flush_interval_s=0.005) as store:
        app = create_app(store, agents=agents, token=token)
        shown = "localhost" if host in ("0.0.0.0", "::") else host
        url = f"http://{shown}:{port}/tapes" + (f"?token={token}" if token else "")
        print(f"tapekit Studio on {db}: {url}", flush=True)
        uvicorn.run(app, host=host, port=port, log_level="warning")


def check_store_exists(db: str | Path, create: bool) -> None:
    """Refuse an SQLite path that does not exist unless ``create`` (URLs are not checked)."""
    if create or (isinstance(db, str) and db.startswith(("postgresql://", "postgres://"))):
        return
    if not Path(db).exists():
        raise ValueError(
            f"no tape store at {db}: the file does not exist (check the path, or pass --create to "
            "make a new, empty store there)"
        )


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` with a real uvicorn server on a free port in a background thread, and yield
    its base URL; the server stops when the block ends. For tests, benchmarks and screenshots."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets; without it every
    # response waits ~40 ms for a delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the Studio server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
