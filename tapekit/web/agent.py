"""The web agent: one node that reads the goal, the current page and the episode's last actions,
and answers with one action (and, optionally, a one-line rationale).

The prompt never grows with the tape: it holds the current observation only (its tree cut to
``max_axtree_chars``) and the last ``last_k`` actions of the episode with their errors, so a
step costs the same at step 2 and at step 200. It works with every backend:

- ``output="json"`` (default): the model answers ``{"thought": "...", "action": "click('12')"}``.
  With ``constrain="page"`` the response schema allows only the actions the page supports, with
  the bids it shows (llama.cpp compiles it into a grammar, so the embedded SmolLM2's answer
  always parses and always names an element that exists); ``constrain="json"`` only fixes the
  object's shape (for servers whose JSON schema support has no ``pattern``); ``"none"`` sends
  no schema.
- ``output="tools"``: one native tool per action (OpenAI-compatible servers); the rationale is
  the message's text.

Robustness as TapeAgents does it: an answer that does not parse is kept on the tape as an
:class:`~tapekit.structured.LLMOutputParsingFailure` and the node asks again, showing the error
(``max_retries`` times in a row, then the episode stops); an action repeated ``repeat_limit``
times in a row with nothing changing stops the episode (:class:`WebAbort`), instead of spending
the step limit on a loop.

The node is optimisable (``instruction`` and ``demos``); :meth:`WebAgentNode.extract_demo` makes
a demo from any node run on a web tape, the student's own or the teacher's, because both write
the same steps (:class:`~tapekit.web.steps.WebThought` and an action after an observation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import LLMOutput, Prompt, SetNextNode, Step, StopStep, Tape, Thought, ToolCallRequest
from tapekit.frameworks.demo import Demo
from tapekit.llm.base import LLM, LLMStream
from tapekit.structured import LLMOutputParsingFailure
from tapekit.web.axtree import parse_axtree
from tapekit.web.steps import (
    ACTION_CLASSES,
    OpenTask,
    SendMsgToUser,
    WebAction,
    WebObservation,
    WebThought,
    parse_action,
)

__all__ = [
    "DEFAULT_INSTRUCTION",
    "EpisodeView",
    "WebAbort",
    "WebAgentNode",
    "answer_schema",
    "episode_view",
    "render_observation",
    "web_agent",
]

DEFAULT_INSTRUCTION = (
    "You operate a web browser to reach the goal. The page is shown as an accessibility tree, "
    'one element per line: [bid] role "name". Answer with the one next action, naming an element '
    "by its bid:\n"
    "click('bid') | fill('bid', 'text') | select_option('bid', 'option') | press('bid', 'Enter') | "
    "hover('bid') | scroll(0, 200) | send_msg_to_user('text') (only when the goal cannot be reached)."
)
"""The node's default instruction (the system message)."""

# the functions an answer may use, in the order the schema lists them
_FUNCTIONS = ("click", "fill", "select_option", "press", "hover", "scroll", "send_msg_to_user")
_BID_ONLY = ("click", "hover")
_TEXT = r"[^'\"\\\n]{0,80}"  # a quoted argument: no quotes, backslashes or newlines (grammar-safe)


class WebAbort(Thought):
    """The agent stopped the episode itself: ``reason`` says why (the same action again and
    again); ``raw`` is the model's answer that triggered it, kept so the run can be rebuilt."""

    kind: Literal["web_abort"] = "web_abort"
    reason: str
    raw: str = ""


# --------------------------------------------------------------------------- what the agent reads


@dataclass(frozen=True)
class EpisodeView:
    """The current episode as the agent sees it: its last observation and every action taken,
    each with the error the browser answered it with ('' when it worked)."""

    observation: WebObservation | None
    actions: list[tuple[WebAction, str]]


def episode_view(tape: Tape[Any, Any], end: int | None = None) -> EpisodeView:
    """The episode running at ``tape.steps[:end]`` (the whole tape by default): the steps after
    its last :class:`~tapekit.web.steps.OpenTask`. One pass from that point, so the cost is the
    episode's length, not the tape's."""
    steps = tape.steps[:end] if end is not None else tape.steps
    start = 0
    for i in range(len(steps) - 1, -1, -1):
        if isinstance(steps[i], OpenTask):
            start = i
            break
    actions: list[tuple[WebAction, str]] = []
    pending: list[WebAction] = []
    last: WebObservation | None = None
    for step in steps[start:]:
        if isinstance(step, WebAction):
            pending.append(step)
        elif isinstance(step, WebObservation):
            last = step
            if pending:
                actions.append((pending[0], step.last_action_error))
                pending = pending[1:]
    return EpisodeView(last, actions)


def render_observation(
    observation: WebObservation,
    actions: list[tuple[WebAction, str]],
    last_k: int = 4,
    max_axtree_chars: int = 2000,
    note: str = "",
) -> str:
    """The user message for one step: the goal, the page's tree (cut to ``max_axtree_chars`` at a
    line boundary), the last ``last_k`` actions with their errors, and ``note`` (why the last
    answer could not be used)."""
    tree = observation.axtree
    if len(tree) > max_axtree_chars:
        cut = tree.rfind("\n", 0, max_axtree_chars)
        tree = tree[: cut if cut > 0 else max_axtree_chars] + "\n(... the rest of the page is cut)"
    lines = [f"Goal: {observation.goal}", "Page:", tree or "(empty page)"]
    if actions:
        shown = actions[-last_k:] if last_k > 0 else []
        lines.append(f"Actions so far ({len(actions)}):" if shown else f"Actions so far: {len(actions)}")
        for action, error in shown:
            lines.append(f"- {call_text(action)}" + (f"  -> error: {error}" if error else ""))
    if note:
        lines.append(note)
    return "\n".join(lines)


def call_text(action: WebAction) -> str:
    """The action as the agent writes it: BrowserGym's call syntax with single quotes, which sit
    inside a JSON string without escapes (``fill('7', 'Ana')``)."""
    return action.call(quote="'")


def answer_schema(bids: list[str] | None, rationale: bool = True) -> dict[str, Any]:
    """The JSON schema of an answer. With ``bids``, the action is a pattern that admits only the
    agent's functions applied to those bids (a grammar for llama.cpp); without, any string."""
    action: dict[str, Any] = {"type": "string"}
    if bids is not None:
        ids = "|".join(re.escape(b) for b in sorted(set(bids), key=lambda b: (len(b), b))) or "0"
        bid = f"'({ids})'"
        forms = [
            rf"(click|hover)\({bid}\)",
            rf"fill\({bid}, '{_TEXT}'\)",
            rf"select_option\({bid}, '{_TEXT}'\)",
            rf"press\({bid}, '(Enter|Tab|Escape|Backspace|ArrowDown|ArrowUp)'\)",
            r"scroll\(0, -?[0-9]{1,4}\)",
            rf"send_msg_to_user\('{_TEXT}'\)",
        ]
        action["pattern"] = "^(" + "|".join(forms) + ")$"
    properties: dict[str, Any] = {}
    if rationale:
        thought: dict[str, Any] = {"type": "string", "maxLength": 100}
        if bids is not None:  # one line, nothing a grammar would have to escape
            thought = {"type": "string", "pattern": r"^[^\"\\\n]{0,100}$"}
        properties["thought"] = thought
    properties["action"] = action
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _tools() -> list[dict[str, Any]]:
    """One OpenAI tool per action function, its parameters from the action class."""
    tools = []
    for name in _FUNCTIONS:
        cls = ACTION_CLASSES[name]
        schema = cls.model_json_schema()
        props = {a: schema["properties"][a] for a in cls.arguments}
        for p in props.values():
            p.pop("title", None)
        doc = (cls.__doc__ or name).strip().splitlines()[0]
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": doc,
                    "parameters": {"type": "object", "properties": props, "required": list(cls.arguments)},
                },
            }
        )
    return tools


class WebAgentNode(Node):
    """The web agent's node (see the module docstring for the prompt and the answer).

    ``instruction`` is the system message; ``demos`` are shown before the observation as
    user/assistant turns (:meth:`extract_demo` makes them); ``last_k`` actions of the episode
    are shown; the tree is cut to ``max_axtree_chars``; ``rationale`` asks for a one-line
    thought before the action; ``max_retries`` answers in a row may fail to parse before the
    episode stops; ``repeat_limit`` identical actions in a row stop it (0: never).
    """

    instruction: str = DEFAULT_INSTRUCTION
    demos: list[Demo] = Field(default_factory=list)
    output: Literal["json", "tools"] = "json"
    constrain: Literal["page", "json", "none"] = "page"
    rationale: bool = True
    last_k: int = 4
    max_axtree_chars: int = 2000
    max_retries: int = 2
    repeat_limit: int = 3

    # ------------------------------------------------------------------ the prompt

    def _failures(self, tape: Tape[Any, Any]) -> list[LLMOutputParsingFailure]:
        """This node's parsing failures since the episode's last observation."""
        out: list[LLMOutputParsingFailure] = []
        for step in reversed(tape.steps):
            if isinstance(step, WebObservation | OpenTask):
                break
            if isinstance(step, LLMOutputParsingFailure) and step.metadata.node == self.name:
                out.append(step)
        return out

    def user_message(self, view: EpisodeView, note: str = "") -> str:
        """The observation as this node shows it."""
        assert view.observation is not None
        return render_observation(view.observation, view.actions, self.last_k, self.max_axtree_chars, note)

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt | None:
        """System (the instruction), the demos, the current observation; the answer's schema
        (or the tools). None when there is nothing to act on (``generate_steps`` then stops)."""
        view = episode_view(tape)
        if view.observation is None or view.observation.done:
            return None
        failures = self._failures(tape)
        if len(failures) > self.max_retries:
            return None
        note = f"Your last answer could not be used ({failures[0].error}). Answer again." if failures else ""
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.instruction}]
        for demo in self.demos:
            messages.append({"role": "user", "content": str(demo.inputs.get("user", ""))})
            messages.append({"role": "assistant", "content": str(demo.outputs.get("assistant", ""))})
        messages.append({"role": "user", "content": self.user_message(view, note)})
        if self.output == "tools":
            return Prompt(messages=messages, tools=_tools())
        schema = None
        if self.constrain != "none":
            bids = [line.bid for line in parse_axtree(view.observation.axtree) if line.bid]
            schema = answer_schema(bids if self.constrain == "page" else None, self.rationale)
        return Prompt(messages=messages, response_schema=schema)

    # ------------------------------------------------------------------ the answer

    def parse(self, output: LLMOutput) -> tuple[str, WebAction]:
        """The rationale and the action of an answer; ``ValueError`` saying what is wrong."""
        if self.output == "tools":
            calls = output.tool_calls or []
            if not calls:
                raise ValueError("no tool call: call one of the action tools")
            call = calls[0]
            cls = ACTION_CLASSES.get(call.name)
            if cls is None:
                raise ValueError(f"unknown action {call.name!r}")
            try:
                args = json.loads(call.arguments or "{}")
                return (output.content or "").strip(), cls(**args)
            except Exception as e:
                raise ValueError(f"{call.name}: bad arguments {call.arguments[:80]!r}") from e
        text = (output.content or "").strip()
        try:
            data = json.loads(text, strict=False)  # a raw newline in a string is no reason to fail
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON object ({e.msg})") from None
        if not isinstance(data, dict) or not isinstance(data.get("action"), str):
            raise ValueError('expected {"thought": "...", "action": "click(\'12\')"}')
        thought = data.get("thought", "")
        return (thought if isinstance(thought, str) else "").strip(), parse_action(data["action"])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The rationale and the action (after ``SetNextNode`` to itself, so the agent keeps
        acting); a parsing failure and a retry; or a stop (episode over, retries used up, an
        action repeated too often)."""
        view = episode_view(tape)
        if view.observation is None:
            yield StopStep(reason="no web observation on the tape: start from an OpenTask")
            return
        if view.observation.done:
            outcome = "solved" if view.observation.reward > 0 else "failed"
            yield StopStep(reason=f"episode over ({outcome}, reward {view.observation.reward:g})")
            return
        failures = self._failures(tape)
        if len(failures) > self.max_retries:
            yield StopStep(
                reason=f"{len(failures)} answers in a row could not be parsed: {failures[0].error}"
            )
            return
        output = llm_stream.get_output()
        try:
            thought, action = self.parse(output)
        except ValueError as e:
            raw = output.content or ""
            if output.tool_calls:
                raw = json.dumps([c.model_dump() for c in output.tool_calls])
            yield LLMOutputParsingFailure(error=str(e), raw=raw)
            yield SetNextNode(next_node=self.name)
            return
        if thought and self.rationale:
            yield WebThought(text=thought)
        if self._repeats(view, action):
            yield WebAbort(
                reason=f"{call_text(action)} {self.repeat_limit + 1} times in a row",
                raw=output.content or "",
            )
            yield StopStep(reason=f"aborted: the same action {self.repeat_limit + 1} times in a row")
            return
        yield SetNextNode(next_node=self.name)
        yield action

    def _repeats(self, view: EpisodeView, action: WebAction) -> bool:
        if self.repeat_limit <= 0 or len(view.actions) < self.repeat_limit:
            return False
        if isinstance(action, SendMsgToUser):
            return False
        recent = [a.call() for a, _ in view.actions[-self.repeat_limit :]]
        return all(r == action.call() for r in recent)

    # ------------------------------------------------------------------ training and demos

    def answer_text(self, thought: str, action: WebAction) -> str:
        """The JSON answer that makes ``thought`` and ``action`` (the format the node asks for)."""
        body: dict[str, str] = {"thought": thought} if self.rationale else {}
        body["action"] = call_text(action)
        return json.dumps(body, ensure_ascii=False)

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The answer that makes exactly the run at ``tape.steps[index]`` (any node's run that
        wrote a thought and an action, e.g. the teacher's)."""
        run = node_run_steps(tape, index)
        for step in run:
            if isinstance(step, LLMOutputParsingFailure | WebAbort):
                return LLMOutput(content=step.raw)
        thought = " ".join(s.text for s in run if isinstance(s, WebThought))
        action = next((s for s in run if isinstance(s, WebAction)), None)
        if action is None:
            raise ValueError(f"the run at step {index} wrote no web action")
        if self.output == "tools":
            call = ToolCallRequest(
                name=action.function, arguments=json.dumps({a: getattr(action, a) for a in action.arguments})
            )
            return LLMOutput(content=thought, tool_calls=[call])
        return LLMOutput(content=self.answer_text(thought, action))

    def extract_demo(self, agent: Agent, tape: Tape[Any, Any], index: int) -> Demo:
        """A demo from the run at ``tape.steps[index]``: the observation it saw, rendered as this
        node renders it, and its answer. Works on the teacher's runs as well as the node's own."""
        view = episode_view(tape, index)
        if view.observation is None:
            raise ValueError(f"no observation before step {index}")
        output = self.make_llm_output(agent, tape, index)
        return Demo.chat(self.user_message(view), output.content or "")


def web_agent(
    llm: LLM,
    name: str = "web",
    instruction: str = DEFAULT_INSTRUCTION,
    demos: list[Demo] | None = None,
    **node_options: Any,
) -> Agent:
    """A web agent: one :class:`WebAgentNode` named ``act`` on ``llm`` (``node_options`` set its
    fields: ``output``, ``constrain``, ``last_k``, ``max_axtree_chars``, ...). Run it with a
    :class:`~tapekit.web.WebEnvironment` from :func:`~tapekit.web.miniwob.start_tape`."""
    node = WebAgentNode(name="act", instruction=instruction, demos=list(demos or []), **node_options)
    return Agent.create(name, llms=llm, nodes=[node])
