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
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import LLMOutput, Prompt, SetNextNode, Step, StopStep, Tape, Thought, ToolCallRequest
from tapekit.errors import AgentError
from tapekit.frameworks.demo import Demo, DemoPick, pick_demos
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
# What the page grammar lets the model write: printable ASCII only (one byte, so at most one
# token, per character: see answer_schema), no character a grammar or a JSON string would have
# to escape. A thought leaves out " and \; a quoted argument leaves out ' as well.
_THOUGHT_CHAR = r"[ !#-\[\]-~]"
_TEXT_CHAR = r"[ !#-&(-\[\]-~]"
THOUGHT_MAX_CHARS = 100
"""The longest thought the page schema allows, whatever the token budget."""
TEXT_MAX_CHARS = 80
"""The longest text argument (``fill``, ``select_option``, ``send_msg_to_user``) the page schema
allows, whatever the token budget."""
_MIN_CHARS = 16  # a smaller budget than this leaves a thought or a text: no guarantee, a warning
_KEYS = ("Enter", "Tab", "Escape", "Backspace", "ArrowDown", "ArrowUp")  # what press may press
# Each action form of the page grammar: its function, its call with the bid and the text as
# placeholders (the fixed part's length is counted from it), its regex (BID and TEXT filled in).
_FORMS: tuple[tuple[str, str, str], ...] = (
    ("click", "click('{bid}')", r"click\({bid}\)"),
    ("hover", "hover('{bid}')", r"hover\({bid}\)"),
    ("fill", "fill('{bid}', '{text}')", r"fill\({bid}, '{text}'\)"),
    ("select_option", "select_option('{bid}', '{text}')", r"select_option\({bid}, '{text}'\)"),
    ("press", f"press('{{bid}}', '{max(_KEYS, key=len)}')", r"press\({bid}, '(" + "|".join(_KEYS) + r")'\)"),
    ("scroll", "scroll(0, -9999)", r"scroll\(0, -?[0-9]{{1,4}}\)"),
    ("noop", "noop(9999)", r"noop\([0-9]{{1,4}}\)"),
    ("send_msg_to_user", "send_msg_to_user('{text}')", r"send_msg_to_user\('{text}'\)"),
)
_WITHOUT_BIDS = ("scroll", "noop", "send_msg_to_user")  # a page that shows no bid
_warned: set[tuple[int, bool, int]] = set()
logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class _Bounds:
    """How long each free part of a page answer may be, in characters, and the longest answer."""

    thought: int
    texts: dict[str, int]
    longest: int


def _layout(rationale: bool) -> int:
    """The characters of an answer's JSON around its strings, in the widest layout a grammar
    allows: llama-cpp-python's converter puts an optional space after every token of the object
    (``{ "thought" : "" , "action" : "" }``); llguidance's layout is ``json.dumps``'s (3 fewer).
    The optional space after the closing brace comes once the answer is complete."""
    keys = ("thought", "action") if rationale else ("action",)
    return len("{ " + " , ".join(f'"{k}" : ""' for k in keys) + " }")


def _forms(bids: list[str]) -> list[tuple[str, str, str]]:
    """The action forms of a page with ``bids``: the agent's functions (``_FUNCTIONS``); on a
    page without bids, those that name no element and ``noop``."""
    wanted = _FUNCTIONS if bids else _WITHOUT_BIDS
    return [form for form in _FORMS if form[0] in wanted]


def _answer_bounds(bids: list[str], rationale: bool, max_tokens: int | None) -> _Bounds:
    """The thought's and the text arguments' bounds (see :func:`answer_schema`)."""
    forms = _forms(bids)
    bid = "x" * max((len(b) for b in bids), default=0)
    fixed = {name: len(call.format(bid=bid, text="")) for name, call, _ in forms}
    takes_text = [name for name, call, _ in forms if "{text}" in call]
    layout = _layout(rationale)
    if max_tokens is None:
        thought = THOUGHT_MAX_CHARS if rationale else 0
        texts = dict.fromkeys(takes_text, TEXT_MAX_CHARS)
    else:
        room = max_tokens - layout - max(fixed.values())
        thought = min(THOUGHT_MAX_CHARS, max(_MIN_CHARS, room // 2)) if rationale else 0
        texts = {
            name: min(TEXT_MAX_CHARS, max(_MIN_CHARS, max_tokens - layout - thought - fixed[name]))
            for name in takes_text
        }
    longest = layout + thought + max(fixed[name] + texts.get(name, 0) for name in fixed)
    return _Bounds(thought=thought, texts=texts, longest=longest)


def answer_schema(
    bids: list[str] | None, rationale: bool = True, max_tokens: int | None = None
) -> dict[str, Any]:
    """The JSON schema of an answer. With ``bids`` (the page's), the action is a pattern that
    admits only the agent's functions applied to those bids (a grammar for llama.cpp and
    llguidance); without (``None``), any string.

    **A page with no bids** (``bids=[]``): the pattern admits only the actions that name no
    element, ``scroll(0, n)``, ``noop(ms)`` (wait for the page) and ``send_msg_to_user('...')``
    (give up), never a bid the page does not show.

    **A complete answer always fits in** ``max_tokens`` (the LLM's limit on the answer's
    tokens): the thought is cut to ``maxLength`` characters and each text argument to its own
    bound, derived from ``max_tokens``, so that the longest answer the schema admits has at most
    ``max_tokens`` characters. The argument that characters bound tokens: every character the
    page schema admits (in the thought, the text arguments, the bids, the fixed parts, the JSON
    around them) is printable ASCII, one byte in UTF-8; every token a grammar lets the model
    sample adds at least one byte to the answer (llama.cpp's grammar sampler rejects tokens with
    an empty piece, and llguidance only allows a special token where the grammar ends); so an
    answer of n characters takes at most n tokens, however the model splits it. The longest
    answer is counted in the widest JSON layout the grammars allow (llama-cpp-python's optional
    space after every token of the object, :func:`_layout`). What is left of ``max_tokens`` after
    that layout and the longest action with empty texts is split: half (at most
    :data:`THOUGHT_MAX_CHARS`) to the thought, the rest to each text argument (at most
    :data:`TEXT_MAX_CHARS`; ``fill`` gets more than ``select_option``, whose name is longer).
    Below that, a budget too small for 16-character thoughts and texts keeps 16 and logs a
    warning naming the ``max_tokens`` that would suffice. Without ``max_tokens`` the caps are
    100 and 80 characters. The bound is in the pattern (``{0,n}``: llama-cpp-python's converter
    ignores ``maxLength`` beside a ``pattern``) and in ``maxLength`` (llguidance honours both).

    The page schema writes printable ASCII only: a goal that needs other characters typed
    cannot be met under it (``constrain="json"`` or ``"none"`` can). ``bids=None`` gives the
    object's shape only, a thought of at most 100 characters (of any kind: no token bound).
    """
    action: dict[str, Any] = {"type": "string"}
    thought: dict[str, Any] = {"type": "string", "maxLength": THOUGHT_MAX_CHARS}
    if bids is not None:
        bounds = _answer_bounds(bids, rationale, max_tokens)
        if max_tokens is not None and bounds.longest > max_tokens:
            key = (max_tokens, rationale, max((len(b) for b in bids), default=0))
            if key not in _warned:
                _warned.add(key)
                logger.warning(
                    "max_tokens=%d cannot hold a complete web answer at one token per character "
                    "with %d-character texts%s: the longest takes %d; give the LLM max_tokens=%d",
                    max_tokens, _MIN_CHARS, " and thought" if rationale else "", bounds.longest,
                    bounds.longest,
                )  # fmt: skip
        ids = "|".join(re.escape(b) for b in sorted(set(bids), key=lambda b: (len(b), b)))
        alternatives = [
            regex.format(bid=f"'({ids})'", text=f"{_TEXT_CHAR}{{0,{bounds.texts.get(name, 0)}}}")
            for name, _call, regex in _forms(bids)
        ]
        action["pattern"] = "^(" + "|".join(alternatives) + ")$"
        # one line, nothing a grammar would have to escape, at most bounds.thought characters
        n = bounds.thought
        thought = {"type": "string", "maxLength": n, "pattern": f"^{_THOUGHT_CHAR}{{0,{n}}}$"}
    properties: dict[str, Any] = {}
    if rationale:
        properties["thought"] = thought
    properties["action"] = action
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def llm_max_tokens(llm: Any) -> int | None:
    """The most tokens ``llm`` writes per answer, when it says: ``parameters["max_tokens"]``
    (llama.cpp, OpenAI-compatible servers; ``max_completion_tokens``, ``max_new_tokens`` too), a
    ``max_tokens`` field (the transformers backends), through wrappers (``.llm``) and server
    pools (their first server). None when it does not say."""
    for _ in range(8):  # wrappers of wrappers, never a cycle
        parameters = getattr(llm, "parameters", None)
        if isinstance(parameters, dict):
            for key in ("max_new_tokens", "max_tokens", "max_completion_tokens"):
                value = parameters.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
        value = getattr(llm, "max_tokens", None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        servers = getattr(llm, "servers", None)
        inner = getattr(llm, "llm", None) or (servers[0] if isinstance(servers, list) and servers else None)
        if inner is None:
            return None
        llm = inner
    return None


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
    user/assistant turns (:meth:`extract_demo` makes them); with ``demo_pick`` only ``k`` of them
    per prompt, those whose page goal is nearest the current goal (:func:`pick_demos`), so a
    large pool of demos from many tasks keeps the prompt short; ``last_k`` actions of the episode
    are shown; the tree is cut to ``max_axtree_chars``; ``rationale`` asks for a one-line
    thought before the action; ``max_retries`` answers in a row may fail to parse before the
    episode stops; ``repeat_limit`` identical actions in a row stop it (0: never).
    ``max_tokens`` is the token budget the page schema keeps every answer within (see
    :func:`answer_schema`); None takes the LLM's own limit when it states one
    (:func:`llm_max_tokens`), 0 bounds nothing beyond the 100- and 80-character caps.
    """

    instruction: str = DEFAULT_INSTRUCTION
    demos: list[Demo] = Field(default_factory=list)
    demo_pick: DemoPick | None = None
    output: Literal["json", "tools"] = "json"
    constrain: Literal["page", "json", "none"] = "page"
    rationale: bool = True
    last_k: int = 4
    max_axtree_chars: int = 2000
    max_retries: int = 2
    repeat_limit: int = 3
    max_tokens: int | None = None

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
        for demo in pick_demos(self.demos, view.observation.goal, self.demo_pick):
            messages.append({"role": "user", "content": str(demo.inputs.get("user", ""))})
            messages.append({"role": "assistant", "content": str(demo.outputs.get("assistant", ""))})
        messages.append({"role": "user", "content": self.user_message(view, note)})
        if self.output == "tools":
            return Prompt(messages=messages, tools=_tools())
        schema = None
        if self.constrain != "none":
            bids = [line.bid for line in parse_axtree(view.observation.axtree) if line.bid]
            schema = answer_schema(
                bids if self.constrain == "page" else None, self.rationale, self.answer_tokens(agent)
            )
        return Prompt(messages=messages, response_schema=schema)

    def answer_tokens(self, agent: Agent) -> int | None:
        """The token budget of an answer: ``max_tokens``, else the LLM's (None: unknown or 0)."""
        if self.max_tokens is not None:
            return self.max_tokens or None
        try:
            return llm_max_tokens(agent.llm_for(self))
        except AgentError:  # no LLM to ask
            return None

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
        wrote a thought and an action, e.g. the teacher's).

        A node without a rationale cannot make a run that holds a thought: ``ValueError`` says
        so, and that :func:`without_thoughts` makes such tapes (the teacher's) its own."""
        run = node_run_steps(tape, index)
        if not self.rationale and any(isinstance(s, WebThought) for s in run):
            raise ValueError(
                f"the run at step {index} holds a WebThought and node {self.name!r} writes no "
                "rationale (rationale=False); strip the thoughts from the tapes first: "
                "tapekit.web.without_thoughts(tape), e.g. make_samples([without_thoughts(t) for t "
                "in tapes], reuse_with=student, ...)"
            )
        return self._answer(run, index)

    def _answer(self, run: list[Step], index: int) -> LLMOutput:
        """The answer of ``run`` in this node's format (a thought only with a rationale)."""
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
        node renders it, and its answer; its match text (``inputs["match"]``) is the page's goal.
        Works on the teacher's runs as well as the node's own."""
        view = episode_view(tape, index)
        if view.observation is None:
            raise ValueError(f"no observation before step {index}")
        output = self._answer(node_run_steps(tape, index), index)  # without a rationale: the action
        demo = Demo.chat(self.user_message(view), output.content or "")
        demo.inputs["match"] = view.observation.goal
        return demo


def without_thoughts(tape: Tape[Any, Any]) -> Tape[Any, Any]:
    """``tape`` without its :class:`~tapekit.web.steps.WebThought` steps (id ``<id>-nothought``):
    what a student that writes no rationale (``rationale=False``) would have written. The
    teacher's tapes hold a thought before each action; ``make_samples(reuse_with=student)``
    needs them stripped for such a student::

        samples = make_samples([without_thoughts(t) for t in tapes], reuse_with=student, tokenizer=tok)
    """
    return type(tape)(
        context=tape.context,
        steps=[s for s in tape.steps if not isinstance(s, WebThought)],
        metadata=tape.metadata.model_copy(update={"id": f"{tape.metadata.id}-nothought"}),
    )


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
