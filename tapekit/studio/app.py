"""The Studio web app: browse, diff, edit and resume the tapes of a tape store.

Server-rendered HTML (Jinja2 with autoescaping on every template) plus one small vanilla-JS file
that loads step details in place. Pages have stable URLs and work when opened directly:

- ``/tapes``: the tapes, filtered by author, agent, error and tag, 50 to a page;
- ``/tapes/{id}``: one tape, 200 steps to a page, colour-coded by kind category;
- ``/tapes/{id}/steps/{index}``: the same page with the step's details: its JSON, its own
  section (the fields and attachments of its presentation, :meth:`tapekit.core.Step.present`),
  the exact prompt and output of the LLM call behind it (tokens, cost, latency), the tape view
  stack at that step, and forms to edit or delete it;
- ``/tapes/{id}/steps/{index}/{name}.{extension}``: a step's attachment (e.g. an image);
- ``/diff?a=ID&b=ID``: two tapes side by side, the first divergence highlighted;
- ``/diff/batches?a=tag:X&b=tag:Y``: two batches of tapes paired by how they started;
- ``/runs``: step or run a registered agent on a tape.

The routes live in ``browse.py``, ``edits.py``, ``diffs.py`` and ``chat.py``, each an
``APIRouter`` of module-level handlers that get the app's state through a dependency
(``StudioDep``); ``pages.py`` holds what they share. Nothing changes a stored tape: edits and
runs save a new child tape (``parent_id`` = the tape it came from) and redirect to it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

from tapekit.store import TapeStore, open_store
from tapekit.studio import browse, chat, diffs, edits
from tapekit.studio.pages import HERE, PageError, Studio, studio_of
from tapekit.studio.pages import STEPS_PER_PAGE as STEPS_PER_PAGE
from tapekit.studio.pages import TAPES_PER_PAGE as TAPES_PER_PAGE
from tapekit.studio.runs import AgentSource, load_agents
from tapekit.studio.security import SecurityMiddleware, is_loopback

logger = logging.getLogger(__name__)


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
    app = FastAPI(title="tapekit Studio", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.studio = Studio(store, load_agents(agents), max_run_loops)
    app.add_middleware(SecurityMiddleware, token=token)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_exception_handler(PageError, page_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, bad_input)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, crashed)
    for module in (browse, edits, diffs, chat):
        app.include_router(module.router)
    return app


# --------------------------------------------------------------------------- error pages


def _error_page(request: Request, status: int, title: str, message: str) -> Response:
    return studio_of(request).render(
        request, "error.html", status, status=status, title=title, message=message
    )


async def page_error(request: Request, exc: PageError) -> Response:
    """A :class:`PageError` as its error page."""
    return _error_page(request, exc.status, exc.title, exc.message)


async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """An HTTP error (no such route, a wrong method) as an error page."""
    title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "Error")
    message = "There is no page at this address." if exc.status_code == 404 else str(exc.detail)
    return _error_page(request, exc.status_code, title, message)


async def bad_input(request: Request, exc: RequestValidationError) -> Response:
    """Invalid path or query parameters as a 400 page naming them."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'][1:]) or 'input'}: {err['msg']}" for err in exc.errors()
    )
    return _error_page(request, 400, "Bad request", problems)


async def crashed(request: Request, exc: Exception) -> Response:
    """Any other failure as a 500 page (logged), never a traceback."""
    logger.exception("studio request %s failed", request.url.path)
    return _error_page(request, 500, "Internal error", f"{type(exc).__name__}: {exc}")


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
    its base URL; the server stops when the block ends. For tests, benchmarks and the docs' picture of it."""
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
