"""LLM calls: the part of :class:`~tapekit.store.TapeStore` that saves the LLM calls behind the
steps, finds the call behind a step, and totals calls, tokens and cost.

The contract: a call is keyed by its prompt id (a later save of the same id replaces it); its
prompt is stored as shared parts (``_prompts.py``), each part submitted once per store object,
so a long conversation's calls do not store its history again and again; a call whose write
could not be submitted makes the encoder forget what it sent, so later calls bring their parts
again. Totals count each call once per group, however many steps or tapes share it.
"""

from __future__ import annotations

from typing import Literal

from tapekit.core import Step
from tapekit.llm.base import LLMCall
from tapekit.store._backend import StoreBackend
from tapekit.store._prompts import PromptEncoder
from tapekit.store._types import Totals
from tapekit.store._writes import call_write, check_id


class LLMCalls(StoreBackend):
    """Saving, reading and totalling LLM calls (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._prompts = PromptEncoder()  # LLM calls' prompts as shared parts (see _prompts.py)

    def save_llm_call(self, call: LLMCall) -> None:
        """Save a completed LLM call, keyed by its prompt id (a later save of the same id
        replaces it)."""
        if not isinstance(call, LLMCall):
            raise TypeError(f"save_llm_call needs an LLMCall, not {type(call).__name__}")
        write = call_write(call, self._prompts)
        try:
            self._check_open()
            self._submit(write)
        except BaseException:
            self._prompts.forget()  # its parts were not queued: later prompts must bring them
            raise

    def get_llm_call(self, prompt_id: str) -> LLMCall | None:
        """The LLM call made with prompt ``prompt_id``, if it was stored."""
        check_id(prompt_id, "prompt_id")
        self.flush()
        return next(iter(self._select_llm_calls([prompt_id])), None)

    def list_llm_calls(self, model: str | None = None) -> list[str]:
        """Prompt ids of the stored LLM calls, oldest first, optionally of one model."""
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a string or None, not {model!r}")
        self.flush()
        return self._select_llm_call_ids(model)

    def llm_call_for_step(self, step: Step) -> LLMCall | None:
        """The exact prompt and output behind ``step`` (None for steps made without an LLM)."""
        if not isinstance(step, Step):
            raise TypeError(f"llm_call_for_step needs a Step, not {type(step).__name__}")
        return self.get_llm_call(step.metadata.prompt_id) if step.metadata.prompt_id else None

    def totals(self, by: Literal["tape", "agent", "node"] = "agent", tape_id: str | None = None) -> Totals:
        """Calls, tokens and cost grouped by tape, agent or node (``agent.node``), optionally
        for one tape. Each LLM call counts once per group, however many steps it made and
        however many tapes hold those steps (a continued tape shares its parent's calls)."""
        if by not in ("tape", "agent", "node"):
            raise ValueError(f"totals by {by!r}: choose 'tape', 'agent' or 'node'")
        if tape_id is not None:
            check_id(tape_id)
        self.flush()
        return self._select_totals(by, tape_id)
