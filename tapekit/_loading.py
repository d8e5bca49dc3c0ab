"""Load user code named as ``package.module:attr`` (the CLI, the Studio and Ray workers do)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tapekit.agent import Agent
    from tapekit.environment import Environment


def load_object(target: str) -> Any:
    """The object that ``target`` (``package.module:attr``, ``attr`` may be dotted) names."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"target {target!r} must look like 'package.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name!r} for target {target!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (target {target!r})")
        obj = getattr(obj, part)
    return obj


def load_factory(target: str) -> tuple[Agent, Environment]:
    """Call the ``module:attr`` factory ``target`` and check it returns ``(agent, environment)``."""
    from tapekit.agent import Agent
    from tapekit.environment import Environment

    factory = load_object(target)
    if not callable(factory):
        raise ValueError(f"target {target!r} is not callable")
    try:
        made = factory()
    except Exception as e:
        raise ValueError(f"calling {target!r} failed: {type(e).__name__}: {e}") from e
    if (
        not isinstance(made, tuple)
        or len(made) != 2
        or not isinstance(made[0], Agent)
        or not isinstance(made[1], Environment)
    ):
        raise ValueError(f"target {target!r} must return (agent, environment), got {made!r:.200}")
    return made
