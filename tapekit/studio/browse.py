"""The Studio's tape browser: the tape list (filters, pages), a tape's steps, a step's details
(its JSON, the LLM call behind it, the view stack at that step)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from tapekit.store import TapeFilter, TapeInfo
from tapekit.studio.data import (
    root_agent_name,
    screenshot_png,
    shown_fields,
    step_author,
    step_row,
    view_infos,
    web_fields,
)
from tapekit.studio.pages import (
    STEPS_PER_PAGE,
    TAPES_PER_PAGE,
    PageError,
    Studio,
    int_param,
    maybe_info,
    page_count,
    page_of,
)
from tapekit.studio.runs import next_actor

__all__ = ["add_browse_routes"]


def add_browse_routes(app: FastAPI, studio: Studio) -> None:
    """Add ``/``, ``/tapes``, ``/tapes/{id}``, ``/tapes/{id}/steps/{index}`` and
    ``/tapes/{id}/steps/{index}/screenshot.png`` to ``app``."""
    store = studio.store

    @app.get("/", include_in_schema=False)
    def home() -> Response:
        return RedirectResponse("/tapes", status_code=303)

    @app.get("/tapes", response_class=HTMLResponse)
    def tapes(request: Request) -> Response:
        q = request.query_params
        error = q.get("error", "")
        if error not in ("", "yes", "no"):
            raise PageError(400, "Bad request", f"error must be 'yes', 'no' or empty, not {error!r}.")
        where = TapeFilter(
            author=q.get("author") or None,
            agent=q.get("agent") or None,
            tag=q.get("tag") or None,
            parent_id=q.get("parent") or None,
            has_error={"yes": True, "no": False}.get(error),
        )
        page = int_param(q.get("page"), "page", 1)
        total = store.count_tapes(where)
        pages = page_count(total, TAPES_PER_PAGE)
        if page > pages:
            raise PageError(400, "Bad request", f"page {page} is past the last page ({pages}).")
        infos = store.list_tape_infos(where, limit=TAPES_PER_PAGE, offset=(page - 1) * TAPES_PER_PAGE)
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
        default = page_of(step_index) if step_index is not None else 1
        page = int_param(request.query_params.get("page"), "page", default)
        pages = page_count(n, STEPS_PER_PAGE)
        if page > pages:
            raise PageError(400, "Bad request", f"page {page} is past the last page ({pages}) of this tape.")
        detail = step_detail(info, step_index) if step_index is not None else None
        if request.query_params.get("fragment") == "1":
            if detail is None:
                raise PageError(400, "Bad request", "fragment=1 is for step pages.")
            return studio.render(request, "step_panel.html", info=info, d=detail)
        start = (page - 1) * STEPS_PER_PAGE
        children = store.list_tape_infos(TapeFilter(parent_id=tape_id), limit=20)
        return studio.render(
            request,
            "tape.html",
            info=info,
            rows=studio.rows(info, start, min(start + STEPS_PER_PAGE, n)),
            page=page,
            pages=pages,
            parent=maybe_info(store, info.parent_id),
            children=children,
            n_children=len(children)
            if len(children) < 20
            else store.count_tapes(TapeFilter(parent_id=tape_id)),
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
            "json": json.dumps(shown_fields(step), indent=2, ensure_ascii=False),
            "web": web_fields(step),
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

    @app.get("/tapes/{tape_id}/steps/{index}/screenshot.png")
    def screenshot(tape_id: str, index: int) -> Response:
        """A web observation's screenshot as PNG bytes (404 when the step has no valid one)."""
        info = studio.info(tape_id)
        if not 0 <= index < info.n_steps:
            raise PageError(
                404, "No such step", f"Tape {tape_id!r} has {info.n_steps} steps; there is no step {index}."
            )
        png = screenshot_png(studio.steps(info, index, index + 1)[0])
        if png is None:
            message = f"Step {index} of tape {tape_id!r} has no screenshot (or not a valid PNG)."
            raise PageError(404, "No screenshot", message)
        # a stored step never changes: the browser may keep the image
        return Response(png, media_type="image/png", headers={"cache-control": "private, max-age=86400"})
