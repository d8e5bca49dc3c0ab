"""A payments assistant whose ``pay`` tool must not run twice, on a bank that sometimes does not
answer, fully offline.

``pay`` is a ``once`` tool (:mod:`tapekit.effects`): in a stored session its call is journalled
before it runs. The bank (``BANK``, in this process) carries out every payment it is sent, but
for an odd amount it does not answer (``EffectInDoubt``), as a request that timed out: the call
is then in doubt, and the session waits for a person to check the bank and say what happened
(done, failed, or retry; a retry of an odd amount times out again). Try it in the terminal:

    tapekit chat --db pay.db --agent tapekit.testing.payer:assistant -m "pay 5"

The scripted model (``pay_brain``) calls ``pay`` for "pay AMOUNT", reports a tool's result, and
echoes anything else.
"""

from __future__ import annotations

import re

from tapekit.agent import Agent
from tapekit.core import LLMOutput, Prompt, ToolCallRequest
from tapekit.effects import EffectInDoubt, tool_call_key
from tapekit.environment import Tool, ToolEnvironment
from tapekit.llm import FunctionLLM
from tapekit.nodes import ToolCallingNode

BANK: list[tuple[int, str]] = []  # every payment the bank carried out: (amount, key)


def pay(amount: int) -> str:
    """Pay an amount.

    Args:
        amount: the amount to pay.
    """
    BANK.append((amount, tool_call_key()))
    if amount % 2:
        raise EffectInDoubt("the bank did not answer in time")
    return f"paid {amount}"


ENVIRONMENT = ToolEnvironment([Tool(pay, effect="once")])


def pay_brain(prompt: Prompt) -> LLMOutput:
    """The scripted model: ``pay`` for "pay AMOUNT", a report after a tool result, an echo."""
    last = prompt.messages[-1] if prompt.messages else {"role": "user", "content": ""}
    if last["role"] == "tool":
        return LLMOutput(content=f"Done: {last['content']}")
    text = str(last.get("content") or "")
    match = re.match(r"\s*pay\s+(\d+)", text, re.I)
    if match:
        call = ToolCallRequest(
            id=f"call_{len(prompt.messages)}", name="pay", arguments=f'{{"amount": {match[1]}}}'
        )
        return LLMOutput(tool_calls=[call])
    return LLMOutput(content=f"You said: {text}")


def assistant() -> tuple[Agent, ToolEnvironment]:
    """The agent and its environment, for ``tapekit chat --agent tapekit.testing.payer:assistant``."""
    node = ToolCallingNode.for_environment(ENVIRONMENT, name="reply", final="message")
    agent = Agent.create("payer", llms=FunctionLLM(fn=pay_brain, model_name="pay-brain"), nodes=[node])
    return agent, ENVIRONMENT
