"""Deprecated: the tiny model moved to :mod:`tapekit.testing.tiny` (import it from there)."""

from __future__ import annotations

from tapekit.testing import tiny as _new
from tapekit.training._moved import moved_to

__getattr__ = moved_to(__name__, _new)
