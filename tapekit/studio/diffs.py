"""The Studio's comparisons: two tapes side by side from their first divergence, and two batches
of tapes paired by how they started."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, Response

from tapekit._diff import first_divergence
from tapekit.store import TapeFilter, TapeInfo
from tapekit.studio.data import batch_pairs, diff_rows
from tapekit.studio.pages import (
    MAX_BATCH,
    STEPS_PER_PAGE,
    PageError,
    Studio,
    StudioDep,
    int_param,
    page_count,
    page_of,
)

router = APIRouter()
"""``/diff`` and ``/diff/batches``."""


@router.get("/diff", response_class=HTMLResponse)
def diff(request: Request, studio: StudioDep) -> Response:
    """Two tapes side by side, from the page of their first divergence."""
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
    default = page_of(first) if first is not None else 1
    page = int_param(q.get("page"), "page", default)
    pages = page_count(longest, STEPS_PER_PAGE)
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


@router.get("/diff/batches", response_class=HTMLResponse)
def batch_diff(request: Request, studio: StudioDep) -> Response:
    """Two batches of tapes, paired by how they started."""
    q = request.query_params
    spec_a, spec_b = q.get("a", "").strip(), q.get("b", "").strip()
    if not spec_a or not spec_b:
        return studio.render(request, "batches.html", pairs=None, spec_a=spec_a, spec_b=spec_b)
    batch_a, batch_b = batch(studio, spec_a), batch(studio, spec_b)
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


def batch(studio: Studio, spec: str) -> list[TapeInfo]:
    """The tapes of a batch: ``tag:NAME`` (oldest first) or tape ids."""
    if spec.startswith("tag:"):
        tag = spec[4:].strip()
        if not tag:
            raise PageError(400, "Bad request", "Write tag:NAME, with a tag name.")
        infos = studio.store.list_tape_infos(TapeFilter(tag=tag), limit=MAX_BATCH + 1)
        if len(infos) > MAX_BATCH:
            raise PageError(400, "Too many tapes", f"Tag {tag!r} has over {MAX_BATCH} tapes; compare fewer.")
        infos.reverse()  # oldest first: the order the batch ran in
        return infos
    ids = [part for part in re.split(r"[\s,]+", spec) if part]
    if len(ids) > MAX_BATCH:
        raise PageError(400, "Too many tapes", f"Compare at most {MAX_BATCH} tapes per batch.")
    return [studio.info(i) for i in ids]
