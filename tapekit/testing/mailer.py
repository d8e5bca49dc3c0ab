"""A mail assistant whose ``send_email`` tool needs a person's approval, fully offline.

The model is a scripted stand-in (``mail_brain``): asked to "email ADDRESS: TEXT" it calls
``send_email``; given the tool's result it tells the user what happened; anything else it
echoes. ``lookup_address`` runs without approval. Try it in the terminal:

    tapekit chat --db mail.db --agent tapekit.testing.mailer:assistant

and type ``email bob@example.com: lunch at noon?``; the session stops for your approval
(yes / no / edit the arguments), and can be resumed by any later ``tapekit chat --tape ID``.
"""

from __future__ import annotations

import json
import re

from tapekit.agent import Agent
from tapekit.core import LLMOutput, Prompt, ToolCallRequest
from tapekit.human import ApprovalEnvironment, approval_required
from tapekit.llm import FunctionLLM
from tapekit.nodes import ToolCallingNode

OUTBOX: list[dict[str, str]] = []  # what send_email sent, in this process

ADDRESSES = {"bob": "bob@example.com", "alice": "alice@example.com"}


def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: the recipient's address.
        body: the text of the email.
    """
    OUTBOX.append({"to": to, "body": body})
    return f"sent to {to}"


def lookup_address(name: str) -> str:
    """The email address of a contact.

    Args:
        name: the contact's first name.
    """
    return ADDRESSES.get(name.lower(), f"no address for {name}")


ENVIRONMENT = ApprovalEnvironment([lookup_address, approval_required(send_email)])


def mail_brain(prompt: Prompt) -> LLMOutput:
    """The scripted model: a tool call for "email ADDRESS: TEXT", a report after a tool result,
    an echo otherwise."""
    last = prompt.messages[-1] if prompt.messages else {"role": "user", "content": ""}
    if last["role"] == "tool":
        return LLMOutput(content=f"Done: {last['content']}")
    text = str(last.get("content") or "")
    match = re.match(r"\s*email\s+(\S+)\s*:\s*(.+)", text, re.S | re.I)
    if match:
        arguments = json.dumps({"to": match.group(1), "body": match.group(2).strip()})
        call_id = f"call_{len(prompt.messages)}"
        return LLMOutput(tool_calls=[ToolCallRequest(id=call_id, name="send_email", arguments=arguments)])
    return LLMOutput(content=f"You said: {text}")


def make_agent() -> Agent:
    """The mail assistant on the scripted model."""
    return Agent.create(
        "mailer",
        llms=FunctionLLM(fn=mail_brain, model_name="mail-brain"),
        nodes=[  # answer, or call a tool, then come back here
            ToolCallingNode.for_environment(
                ENVIRONMENT, name="reply", system="You write and send emails for the user.", final="message"
            )
        ],
    )


def assistant() -> tuple[Agent, ApprovalEnvironment]:
    """The agent and its environment, for ``tapekit chat --agent tapekit.testing.mailer:assistant``."""
    return make_agent(), ENVIRONMENT
