"""The Studio's tape browser: the tape list (filters, pages), a tape's steps, a step's details
(its JSON, its own panel section, the LLM call behind it, the view stack at that step) and the
files a step carries (its presentation's attachments)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from tapekit.rendering import presentation
from tapekit.store import TapeFilter, TapeInfo
from tapekit.studio.data import (
    ATTACHMENT_NAME,
    INLINE_TYPES,
    attachment_bytes,
    panel,
    root_agent_name,
    shown_fields,
    step_author,
    step_row,
    view_infos,
)
from tapekit.studio.pages import (
    STEPS_PER_PAGE,
    TAPES_PER_PAGE,
    PageError,
    Studio,
    StudioDep,
    int_param,
    maybe_info,
    page_count,
    page_of,
)
from tapekit.studio.runs import next_actor

router = APIRouter()
"""``/``, ``/tapes``, ``/tapes/{id}``, ``/tapes/{id}/steps/{index}`` and a step's attachments,
``/tapes/{id}/steps/{index}/{name}.{extension}``."""


@router.get("/", include_in_schema=False)
def home() -> Response:
    """The tape list."""
    return RedirectResponse("/tapes", status_code=303)


@router.get("/tapes", response_class=HTMLResponse)
def tapes(request: Request, studio: StudioDep) -> Response:
    """Every tape, newest first, filtered and paged."""
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
    total = studio.store.count_tapes(where)
    pages = page_count(total, TAPES_PER_PAGE)
    if page > pages:
        raise PageError(400, "Bad request", f"page {page} is past the last page ({pages}).")
    infos = studio.store.list_tape_infos(where, limit=TAPES_PER_PAGE, offset=(page - 1) * TAPES_PER_PAGE)
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


@router.get("/tapes/{tape_id}", response_class=HTMLResponse)
def tape(request: Request, tape_id: str, studio: StudioDep) -> Response:
    """One tape, a page of its steps."""
    return tape_page(studio, request, tape_id, None)


@router.get("/tapes/{tape_id}/steps/{index}", response_class=HTMLResponse)
def step(request: Request, tape_id: str, index: int, studio: StudioDep) -> Response:
    """One tape with step ``index`` open in the panel (``?fragment=1``: the panel alone)."""
    return tape_page(studio, request, tape_id, index)


@router.get("/tapes/{tape_id}/steps/{index}/{name}.{extension}")
def attachment(tape_id: str, index: int, name: str, extension: str, studio: StudioDep) -> Response:
    """The step's attachment ``name`` as its bytes; a 404 page when the step has no such
    attachment, its file name's extension is not its media type's, or its data cannot be served
    (not what its media type says, or too large). Images and plain text are served as
    themselves, anything else as a download of bytes."""
    info = studio.info(tape_id)
    check_index(info, index)
    found = presentation(studio.steps(info, index, index + 1)[0]).attachments.get(name)
    data = None
    if found is not None and ATTACHMENT_NAME.fullmatch(name) and found.extension == extension:
        data = attachment_bytes(found)
    if found is None or data is None:
        message = f"Step {index} of tape {tape_id!r} has no {name} (or it is not a valid {extension} file)."
        raise PageError(404, f"No {name}", message)
    # a stored step never changes: the browser may keep the file
    headers = {"cache-control": "private, max-age=86400"}
    media_type = found.media_type
    if media_type not in INLINE_TYPES:
        media_type = "application/octet-stream"
        headers["content-disposition"] = f'attachment; filename="{name}.{extension}"'
    elif media_type == "text/plain":
        media_type = "text/plain; charset=utf-8"
    return Response(data, media_type=media_type, headers=headers)


def check_index(info: TapeInfo, index: int) -> None:
    """A 404 page unless the tape has a step ``index``."""
    if not 0 <= index < info.n_steps:
        raise PageError(
            404, "No such step", f"Tape {info.id!r} has {info.n_steps} steps; there is no step {index}."
        )


def tape_page(studio: Studio, request: Request, tape_id: str, step_index: int | None) -> Response:
    """A tape's page (or, with ``?fragment=1``, only the panel of step ``step_index``)."""
    info = studio.info(tape_id)
    n = info.n_steps
    if step_index is not None:
        check_index(info, step_index)
    default = page_of(step_index) if step_index is not None else 1
    page = int_param(request.query_params.get("page"), "page", default)
    pages = page_count(n, STEPS_PER_PAGE)
    if page > pages:
        raise PageError(400, "Bad request", f"page {page} is past the last page ({pages}) of this tape.")
    detail = step_detail(studio, info, step_index) if step_index is not None else None
    if request.query_params.get("fragment") == "1":
        if detail is None:
            raise PageError(400, "Bad request", "fragment=1 is for step pages.")
        return studio.render(request, "step_panel.html", info=info, d=detail)
    start = (page - 1) * STEPS_PER_PAGE
    store = studio.store
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
        n_children=len(children) if len(children) < 20 else store.count_tapes(TapeFilter(parent_id=tape_id)),
        totals=store.totals("node", tape_id=tape_id),
        d=detail,
    )


def step_detail(studio: Studio, info: TapeInfo, index: int) -> dict[str, Any]:
    """What the panel of step ``index`` shows: the step, its row, JSON and own section, its node
    run, the LLM call behind it, the view stack at it and (on the last step) who moves next."""
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
    shown = presentation(step)  # made once for the row, the JSON and the section
    return {
        "index": index,
        "step": step,
        "row": step_row(step, index, shown=shown),
        "author": step_author(step),
        "json": json.dumps(shown_fields(step, shown), indent=2, ensure_ascii=False),
        "panel": panel(shown),
        "notes": dict(shown.notes),
        "metadata": step.metadata.model_dump(mode="json"),
        "call": studio.store.get_llm_call(pid) if pid else None,
        "run": run,
        "views": views,
        "next": after,
    }
