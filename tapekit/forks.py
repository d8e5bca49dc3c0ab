"""Deprecated: forks run in the engine now (:mod:`tapekit._engine.forks`), a private module.

Forks are made with :class:`~tapekit.core.Fork` steps and run by ``agent.arun`` and the main
loop; nothing here was meant to be called directly. Importing this module warns.
"""

# ruff: noqa: F401 - a deprecated shim: its imports are what it still offers

from __future__ import annotations

import warnings

from tapekit._engine.forks import ForkOutcome, run_fork

warnings.warn(
    "tapekit.forks is deprecated: forks are run by agent.arun and the main loop "
    "(the implementation moved to the private tapekit._engine.forks)",
    DeprecationWarning,
    stacklevel=2,
)
