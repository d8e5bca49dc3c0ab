"""tapekit's exceptions: one root, :class:`TapekitError`, above every error tapekit raises.

``except TapekitError`` catches anything tapekit reports on purpose. Each error also keeps the
builtin base that describes it (a missing tape is a ``KeyError``, a bad configuration a
``RuntimeError`` or ``ValueError``), so code written against those keeps working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tapekit.core import Action


class TapekitError(Exception):
    """The root of every exception tapekit raises on purpose."""


class AgentError(TapekitError, RuntimeError):
    """The agent's configuration or the tape does not let it continue (named in the message)."""


class ReconstructionError(TapekitError, ValueError):
    """A node's ``make_llm_output`` does not reproduce the steps on the tape (diff included)."""


class TrainingError(TapekitError, ValueError):
    """Bad training input (samples, model, config); the message says what and where."""


class ExternalObservationNeeded(TapekitError):
    """The action waits on the outside world (usually a human); the orchestrator stops and the
    tape can be resumed once the observation has been appended."""

    def __init__(self, action: Action, message: str = "") -> None:
        self.action = action
        super().__init__(message or f"action {action.kind!r} needs an observation from outside")
