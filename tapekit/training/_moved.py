"""The shims that moved modules leave behind: the old module warns once, when it is imported,
and serves every name of the new one (``from tapekit.training.rl_loop import train_rl`` keeps
working, with a ``DeprecationWarning`` that names the new module)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def moved_to(old: str, new: ModuleType) -> Callable[[str], Any]:
    """Warn that module ``old`` moved to ``new`` (pointing at the importing line) and return the
    module ``__getattr__`` that serves ``new``'s names from ``old``."""
    warnings.warn(f"{old} moved to {new.__name__}: import from there", DeprecationWarning, stacklevel=3)

    def __getattr__(name: str) -> Any:
        return getattr(new, name)

    return __getattr__
