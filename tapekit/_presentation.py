"""How a step presents itself to people: a one-line summary, the fields of its own panel
section, the files it carries (attachments) and notes that stand in for bulky JSON fields.

:meth:`tapekit.core.Step.present` returns a :class:`StepPresentation`. The plain-text renderer
(:mod:`tapekit.rendering`) prints its summary; the Studio shows all of it (the summary in step
lists, the fields and attachments in the step's panel, the notes in the step's JSON). Neither
knows any step kind by name: a step class says how it looks by overriding ``present()``.

This module is below :mod:`tapekit.core` (it imports nothing from tapekit); its names are
re-exported there.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_ATTACHMENT_BYTES = 20_000_000
"""The largest attachment :meth:`Attachment.data` gives (larger data counts as none)."""

_SIGNATURES: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}
_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "text/plain": "txt",
    "application/json": "json",
}


def media_type_matches(data: bytes, media_type: str) -> bool:
    """Whether ``data`` starts the way files of ``media_type`` do (the PNG, JPEG, GIF and WebP
    signatures are checked; other types have no signature to check, so they match)."""
    if media_type == "image/webp":
        return data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    signatures = _SIGNATURES.get(media_type)
    return signatures is None or data.startswith(signatures)


class Attachment:
    """A file that a step carries (a screenshot, a plot, a recording): its media type and its
    bytes, made on first use and kept (a base64 field is decoded only when something shows it).

    ``data`` is the bytes, or a function that returns them (None: there are none to show).
    :meth:`data` gives None as well when the bytes are larger than ``max_bytes`` or are not what
    ``media_type`` says (a "PNG" without PNG's signature), so a tool never serves them as such.
    """

    __slots__ = ("_cache", "_source", "max_bytes", "media_type")

    def __init__(
        self,
        media_type: str,
        data: bytes | Callable[[], bytes | None],
        max_bytes: int = MAX_ATTACHMENT_BYTES,
    ) -> None:
        self.media_type = media_type
        self.max_bytes = max_bytes
        self._source = data
        self._cache: list[bytes | None] = []  # empty until made

    @classmethod
    def from_base64(cls, media_type: str, text: str, max_bytes: int = MAX_ATTACHMENT_BYTES) -> Attachment:
        """The attachment whose bytes are the base64 ``text`` (strictly decoded on first use;
        text that is not base64, or too long for ``max_bytes``, gives no bytes)."""

        def decode() -> bytes | None:
            if len(text) > max_bytes * 4 // 3 + 4:
                return None
            try:
                return base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                return None

        return cls(media_type, decode, max_bytes)

    def data(self) -> bytes | None:
        """The bytes; None when there are none, they are over ``max_bytes``, or they are not
        what ``media_type`` says."""
        if not self._cache:
            raw = self._source() if callable(self._source) else self._source
            ok = raw is not None and len(raw) <= self.max_bytes and media_type_matches(raw, self.media_type)
            self._cache.append(raw if ok else None)
        return self._cache[0]

    @property
    def extension(self) -> str:
        """The file name extension for the media type (``png``; ``bin`` for unknown types)."""
        return _EXTENSIONS.get(self.media_type, "bin")

    def describe(self) -> str:
        """The size and format for people (``41 KB PNG``), or ``not a valid PNG``."""
        kind = self.extension.upper() if self.media_type in _EXTENSIONS else self.media_type
        data = self.data()
        if data is None:
            return f"not a valid {kind}"
        size = f"{len(data)} B" if len(data) < 1024 else f"{round(len(data) / 1024)} KB"
        return f"{size} {kind}"

    def __repr__(self) -> str:
        return f"Attachment({self.media_type!r})"


@dataclass(frozen=True, slots=True)
class StepPresentation:
    """What people see of a step (see :meth:`tapekit.core.Step.present`).

    - ``summary``: the step's gist in one line (tools fold its white space and cut it to their
      width): the plain-text renderer and the Studio's step lists print it.
    - ``title`` and ``fields``: the step's own section of the Studio's step panel, a heading
      and named values in order. A value shows by its type: a number, a bool, None or a short
      one-line text as a labelled value; a longer or multi-line text as a block; a list or a
      dict as collapsible JSON. Steps with no fields, attachments or error have no section.
    - ``attachments``: files by name (letters, digits, ``-`` and ``_``), e.g. a screenshot; the
      Studio shows images in the section and serves each file on the step's own URL
      (``/tapes/{id}/steps/{i}/{name}.{extension}``).
    - ``notes``: for bulky fields of the step's JSON (a base64 image), the text shown in
      their place, e.g. ``"<screenshot: 41 KB PNG>"``; an edit in the Studio that leaves a
      note as it was shown keeps the stored value.
    - ``error``: a problem to show prominently (a banner), e.g. why the last action failed.
    """

    summary: str
    title: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)
    attachments: Mapping[str, Attachment] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    error: str = ""
