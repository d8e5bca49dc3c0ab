"""The Studio's changes: edit, delete or append a step, or step or run a registered agent; each
saves a new child tape (``parent_id``: the tape it came from) and redirects to it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse, Response

from tapekit.core import Tape
from tapekit.studio.browse import check_index
from tapekit.studio.data import restore_noted
from tapekit.studio.pages import PageError, Studio, StudioDep, read_form, tape_url
from tapekit.studio.runs import (
    NothingToDoError,
    StepInputError,
    advance,
    appended_tape,
    edited_tape,
    parse_step,
    truncated_tape,
)

router = APIRouter()
"""The edit, delete and append routes of a tape, and ``/runs``."""


async def save_child(studio: Studio, child: Tape[Any, Any], first_new: int) -> Response:
    """Store ``child`` and redirect to it, scrolled to step ``first_new``."""
    await run_in_threadpool(studio.store.save_tape, child)
    await run_in_threadpool(studio.store.flush)
    index = min(first_new, len(child) - 1) if len(child) else None
    return RedirectResponse(tape_url(child.metadata.id, index), status_code=303)


@router.post("/tapes/{tape_id}/steps/{index}/edit")
async def edit_step(request: Request, tape_id: str, index: int, studio: StudioDep) -> Response:
    """Replace step ``index`` with the posted JSON (a child tape)."""
    form = await read_form(request)
    info = await run_in_threadpool(studio.info, tape_id)
    check_index(info, index)
    source = await run_in_threadpool(studio.tape, info)
    try:
        new = parse_step(form.get("step", ""), source.steps[index].metadata)
    except StepInputError as e:
        raise PageError(400, "Invalid step", str(e)) from None
    new = restore_noted(new, source.steps[index])  # the JSON box shows notes for bulky fields
    child = edited_tape(source, index, new, keep_rest=form.get("keep_rest") == "on")
    return await save_child(studio, child, index)


@router.post("/tapes/{tape_id}/steps/{index}/delete")
async def delete_step(request: Request, tape_id: str, index: int, studio: StudioDep) -> Response:
    """Drop step ``index`` and the steps after it (a child tape)."""
    await read_form(request)
    info = await run_in_threadpool(studio.info, tape_id)
    check_index(info, index)
    source = await run_in_threadpool(studio.tape, info)
    return await save_child(studio, truncated_tape(source, index), index - 1)


@router.post("/tapes/{tape_id}/append")
async def append_step(request: Request, tape_id: str, studio: StudioDep) -> Response:
    """Add the posted step at the end (a child tape)."""
    form = await read_form(request)
    info = await run_in_threadpool(studio.info, tape_id)
    try:
        new = parse_step(form.get("step", ""))
    except StepInputError as e:
        raise PageError(400, "Invalid step", str(e)) from None
    source = await run_in_threadpool(studio.tape, info)
    return await save_child(studio, appended_tape(source, new), info.n_steps)


@router.get("/runs", response_class=HTMLResponse)
def runs(request: Request, studio: StudioDep) -> Response:
    """The form to step or run a registered agent on a tape."""
    return studio.render(
        request,
        "runs.html",
        recent=studio.store.list_tape_infos(limit=50),
        selected=request.query_params.get("tape", ""),
    )


@router.post("/runs")
async def run(request: Request, studio: StudioDep) -> Response:
    """Step or run a registered agent on a tape (a child tape)."""
    form = await read_form(request)
    name, tape_id, mode = form.get("agent", ""), form.get("tape", "").strip(), form.get("mode", "")
    if not studio.agents:
        raise PageError(400, "No agents", "Start the Studio with --agent module:attr to step or run agents.")
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
            store=studio.store,
        )
    except NothingToDoError as e:
        raise PageError(409, "Nothing to do", f"{e}. Append a step to the tape, then continue.") from None
    return await save_child(studio, result.tape, len(cached))
