"""tapekit's doors: the modules users import from, and the only ones that declare ``__all__``.

The root and the package faces are the API. Every other module is implementation: its names
may move or change without notice, and the names a user needs are re-exported by a door.
``tests/test_doors.py`` holds the examples, the guides and the package to this list.
"""

from __future__ import annotations

# the root and the package faces
FACES: tuple[str, ...] = (
    "tapekit",
    "tapekit.batch",
    "tapekit.evaluate",
    "tapekit.frameworks",
    "tapekit.human",
    "tapekit.llm",
    "tapekit.mcp",
    "tapekit.migrate",
    "tapekit.optimize",
    "tapekit.otel",
    "tapekit.sandbox",
    "tapekit.store",
    "tapekit.studio",
    "tapekit.testing",
    "tapekit.training",
    "tapekit.web",
)

# the teams, models and suites of tapekit.testing, each named in its docstring and imported on
# its own (importing tapekit.testing loads none of them)
TESTING_TOOLS: tuple[str, ...] = (
    "tapekit.testing.analyst",
    "tapekit.testing.chaos",
    "tapekit.testing.mailer",
    "tapekit.testing.payer",
    "tapekit.testing.postgres",
    "tapekit.testing.react",
    "tapekit.testing.research",
    "tapekit.testing.store_conformance",
    "tapekit.testing.tiny",
)

DOORS: tuple[str, ...] = FACES + TESTING_TOOLS
