"""Deprecated: the RL trainer (train_rl, RLRunConfig, RLSetup, RLRunResult) moved to
:mod:`tapekit.training.rl` (import from there)."""

from __future__ import annotations

from tapekit.training import rl as _new
from tapekit.training._moved import moved_to

__getattr__ = moved_to(__name__, _new)
