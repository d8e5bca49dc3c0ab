"""One model served by several OpenAI-compatible servers (vLLM, SGLang, llama.cpp), one server per tape.

:class:`ServerPoolLLM` sends each asyncio task's calls (the batch runner runs each tape in one
task) to one server, round robin over the tasks, so a tape's calls reuse that server's prefix
cache. The RL loop's remote rollouts sample through it
(:class:`~tapekit.training.rl.RemotePolicy`); the token trace of each call records the
policy version that was served.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

from pydantic import PrivateAttr

from tapekit.core import Prompt
from tapekit.llm.base import LLM, LLMError, LLMEvent
from tapekit.llm.openai_compat import OpenAICompatibleLLM


class _Sticky:
    """Round robin over servers, one pick per asyncio task (the batch runner runs each tape in
    one task, so a tape's calls go to one server and reuse its prefix cache)."""

    def __init__(self) -> None:
        self.counter = itertools.count()
        self.picks: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # a pickled LLM (e.g. sent to a Ray worker) starts afresh
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def pick(self, n: int) -> int:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        with self.lock:
            if task is None:
                return next(self.counter) % n
            if task not in self.picks:
                self.picks[task] = next(self.counter) % n
            return self.picks[task]


class ServerPoolLLM(LLM):
    """One model on several OpenAI-compatible servers: each asyncio task (each tape in a batch)
    is sent to the next server in turn. The calls carry ``model_name``; the token trace of each
    call gets ``policy_version`` (as it was when the call started). A server that returns no
    token ids is passed through as such (``tokens`` None): RL rows refuse those calls."""

    servers: list[OpenAICompatibleLLM]
    policy_version: str | None = None
    _sticky: _Sticky = PrivateAttr(default_factory=_Sticky)

    def serve(self, model_name: str, policy_version: str | None) -> None:
        """Send the next calls to ``model_name``, recording ``policy_version`` on their tokens
        (call it between rollouts, not while calls are in flight)."""
        self.model_name = model_name
        self.policy_version = policy_version
        for server in self.servers:
            server.model_name = model_name

    def server_for_this_task(self) -> OpenAICompatibleLLM:
        """The server that the current asyncio task's calls go to."""
        if not self.servers:
            raise LLMError("ServerPoolLLM has no servers")
        return self.servers[self._sticky.pick(len(self.servers))]

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        version = self.policy_version
        server = self.server_for_this_task()
        async for event in server.astream(prompt):
            if event.tokens is not None:
                event = event.model_copy(
                    update={"tokens": event.tokens.model_copy(update={"policy_version": version})}
                )
            yield event

    async def aclose(self) -> None:
        """Close the servers' HTTP sessions of the running event loop."""
        for server in self.servers:
            await server.aclose()
