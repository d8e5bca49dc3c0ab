"""Fixtures for the browser environment's tests: Debian's Chromium driven by Playwright (never a
downloaded browser) on MiniWob++ pages from the ``miniwob`` wheel. Tests that need the browser
are marked ``browser`` and skip, saying why, when a piece is missing."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from tapekit.web.environment import DEFAULT_CHROMIUM

MISSING = [
    why
    for why, ok in (
        (f"no Chromium at {DEFAULT_CHROMIUM} (scripts/install-system.sh)", os.path.exists(DEFAULT_CHROMIUM)),
        ("no playwright (pip install 'tapekit[web]')", importlib.util.find_spec("playwright") is not None),
        ("no miniwob (pip install 'tapekit[web]')", importlib.util.find_spec("miniwob") is not None),
    )
    if not ok
]
needs_browser = pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING))


@pytest.fixture(scope="module")
def env() -> Iterator[object]:
    """One environment for a test module (2 concurrent episodes: the CI machine has 2 cores)."""
    if MISSING:
        pytest.skip("; ".join(MISSING))
    from tapekit.web import WebEnvironment

    with WebEnvironment(max_concurrent=2, timeout_s=20) as environment:
        yield environment
