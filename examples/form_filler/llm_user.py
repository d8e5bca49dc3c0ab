"""An LLM playing the simulated users (``run.py --user-url``).

The behaviour's deterministic program (:meth:`~examples.form_filler.users.UserBehavior.turn`)
still decides *what* the user says: which slot, which value, valid or not, a skip, a question.
Those are the ground truth the GREADTH rules read, so they stay exactly as the program made
them. The LLM decides only *how* it is said: :class:`LLMUser` shows it the behaviour's
description, the user's intent (form, company, the values the user means to give), the
conversation so far, the facts to convey and the program's own wording, and asks for the user's
next message only.

The user step records the program's facts plus ``facts["user_llm"]`` (the model's name) and
``facts["programmatic_text"]`` (the program's message, for reference). When the LLM fails or
answers nothing usable, the program's message is used instead and ``facts["user_llm_fallback"]``
says why: a fallback is never silent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from examples.form_filler.steps import CallFunctionAction, ExitAction, PromptUserForTextMessageAction
from examples.form_filler.users import UserBehavior, UserIntent, purpose_of, respond
from tapekit import Prompt, Step, Tape, UserStep
from tapekit.llm import LLM, LLMError

__all__ = ["USER_TEMPLATE", "LLMUser", "clean_reply", "render_dialogue"]

USER_TEMPLATE = """You play a user talking to a company's form-filling assistant.

How you behave in this message: {description}

What you want: to {purpose} at {company} (the form {form}).
The values you mean to give, field by field:
{values}

The conversation so far:
{dialogue}

Your next message must convey exactly these facts, no more and no fewer (values written exactly
as shown, invalid ones included):
{facts}
A plain version of the message: "{reference}"

Write only your next message, as the user would type it, in the style of your behaviour. No
quotes, no "User:", no explanation."""
"""The prompt; ``{description}``, ``{purpose}``, ``{company}``, ``{form}``, ``{values}``,
``{dialogue}``, ``{facts}`` and ``{reference}`` are filled in."""

_BOOKKEEPING = ("behavior", "intent")  # in every user step's facts, not something to say


def _dialogue_line(step: Step) -> str | None:
    match step:
        case UserStep():
            return f"User: {step.content}"
        case PromptUserForTextMessageAction():
            return f"Assistant: {step.prompt}"
        case ExitAction():
            return f"Assistant (leaving): {step.text}"
        case CallFunctionAction():
            return f"(The assistant submitted the form {step.function}.)"
        case _:
            return None


def render_dialogue(tape: Tape[Any, Any]) -> str:
    """The messages of ``tape`` as ``User: ...`` / ``Assistant: ...`` lines (thoughts left out)."""
    lines = [line for step in tape.steps if (line := _dialogue_line(step))]
    return "\n".join(lines) or "(nothing yet)"


def clean_reply(text: str) -> str:
    """The user's message in an LLM's answer: surrounding space, a leading ``User:`` label and
    one pair of enclosing quotes removed ('' when nothing is left)."""
    reply = text.strip()
    if reply.lower().startswith("user:"):
        reply = reply[len("user:") :].strip()
    if len(reply) >= 2 and reply[0] == reply[-1] and reply[0] in "\"'":
        reply = reply[1:-1].strip()
    return reply


class LLMUser:
    """Writes the simulated user's turns with ``llm``, the facts kept from the behaviour's
    program (see the module docstring). ``template`` replaces :data:`USER_TEMPLATE`;
    ``max_concurrency`` bounds the calls in flight in :meth:`respond_many`."""

    def __init__(self, llm: LLM, *, template: str = USER_TEMPLATE, max_concurrency: int = 8) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.llm = llm
        self.template = template
        self.max_concurrency = max_concurrency

    @property
    def model(self) -> str:
        """The LLM's model name (recorded in every user step's facts)."""
        return self.llm.model_name or type(self.llm).__name__

    def prompt(
        self, behavior: UserBehavior, tape: Tape[Any, Any], intent: UserIntent, programmatic: UserStep
    ) -> Prompt:
        """The prompt asking for the user's next message on ``tape`` that conveys what the
        ``programmatic`` step (the behaviour's program's) says."""
        known = programmatic.metadata.other.get("facts") or {}
        facts = {k: v for k, v in known.items() if k not in _BOOKKEEPING}
        parts = {
            "description": " ".join(behavior.description.split()),
            "purpose": purpose_of(intent.form),
            "company": intent.company.name,
            "form": intent.form.name,
            "values": "\n".join(f"- {k}: {v}" for k, v in intent.values.items()),
            "dialogue": render_dialogue(tape),
            "facts": json.dumps(facts, ensure_ascii=False, default=str)
            if facts
            else "(none beyond the message)",
            "reference": programmatic.content,
        }
        return Prompt(messages=[{"role": "user", "content": self.template.format(**parts)}])

    async def arespond(
        self, behavior: UserBehavior, tape: Tape[Any, Any], intent: UserIntent, seed: int = 0
    ) -> UserStep:
        """``behavior``'s message on ``tape`` in the LLM's words, as a user step with the
        program's facts (``BehaviorNotApplicable`` if the behaviour cannot act there)."""
        programmatic = respond(behavior, tape, intent, seed)
        facts: dict[str, Any] = {
            **programmatic.metadata.other["facts"],
            "user_llm": self.model,
            "programmatic_text": programmatic.content,
        }
        try:
            output = await self.llm.agenerate(self.prompt(behavior, tape, intent, programmatic))
            text = clean_reply(output.content or "")
            if not text:
                facts["user_llm_fallback"] = "the LLM answered no text"
        except LLMError as e:
            text = ""
            facts["user_llm_fallback"] = f"the LLM failed: {e}"
        metadata = programmatic.metadata.model_copy(update={"other": {"facts": facts}})
        return UserStep(content=text or programmatic.content, metadata=metadata)

    def respond(
        self, behavior: UserBehavior, tape: Tape[Any, Any], intent: UserIntent, seed: int = 0
    ) -> UserStep:
        """Sync version of :meth:`arespond`."""
        return asyncio.run(self.arespond(behavior, tape, intent, seed))

    def respond_many(
        self, items: Sequence[tuple[Tape[Any, Any], UserIntent, UserBehavior]], seed: int = 0
    ) -> list[UserStep]:
        """The user's message for each ``(tape, intent, behavior)``, in order, at most
        ``max_concurrency`` LLM calls at a time."""

        async def all_of() -> list[UserStep]:
            gate = asyncio.Semaphore(self.max_concurrency)

            async def one(tape: Tape[Any, Any], intent: UserIntent, behavior: UserBehavior) -> UserStep:
                async with gate:
                    return await self.arespond(behavior, tape, intent, seed)

            return list(await asyncio.gather(*(one(t, i, b) for t, i, b in items)))

        return asyncio.run(all_of())

    def __repr__(self) -> str:
        return f"LLMUser({type(self.llm).__name__}, model={self.model!r})"
