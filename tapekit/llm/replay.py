"""An LLM that answers only from recorded calls: for replay tests and exact resumption."""

from __future__ import annotations

import difflib
import json
from collections.abc import AsyncIterator

from pydantic import PrivateAttr

from tapekit.core import LLMOutput, Prompt
from tapekit.errors import TapekitError
from tapekit.llm.base import LLM, LLMCall, LLMEvent


class ReplayMissError(TapekitError, LookupError):
    """The prompt was never recorded; the message shows its diff to the closest recorded one."""


class ReplayLLM(LLM):
    """Gives the recorded output for a prompt equal (all but its id) to a recorded prompt.

    The same prompt recorded several times is answered in recording order, then with its last
    output. An unknown prompt raises :class:`ReplayMissError`.
    """

    model_name: str = "replay"
    calls: list[LLMCall]
    _outputs: dict[str, list[LLMOutput]] = PrivateAttr(default_factory=dict)
    _served: dict[str, int] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: object, /) -> None:
        """Index the recorded outputs by prompt content."""
        for call in self.calls:
            self._outputs.setdefault(call.prompt.content_key(), []).append(call.output)

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        key = prompt.content_key()
        outputs = self._outputs.get(key)
        if outputs is None:
            raise ReplayMissError(self._explain_miss(prompt))
        served = self._served.get(key, 0)
        self._served[key] = served + 1
        yield LLMEvent(output=outputs[min(served, len(outputs) - 1)])

    def _explain_miss(self, prompt: Prompt) -> str:
        if not self.calls:
            return "no recorded LLM calls to replay"
        wanted = _pretty(prompt)
        best = max(
            (c.prompt for c in self.calls),
            key=lambda p: difflib.SequenceMatcher(None, wanted, _pretty(p), autojunk=False).quick_ratio(),
        )
        diff = "\n".join(
            difflib.unified_diff(
                _pretty(best).splitlines(),
                wanted.splitlines(),
                "closest recorded prompt",
                "this prompt",
                lineterm="",
            )
        )
        return f"this prompt was not recorded ({len(self.calls)} recorded calls); diff:\n{diff}"


def _pretty(prompt: Prompt) -> str:
    return json.dumps(prompt.model_dump(exclude={"id"}), indent=1, sort_keys=True, ensure_ascii=False)
