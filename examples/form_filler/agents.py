"""The form filler's agents (section 5.3): the multi-node Teacher and the single-node Student.

Teacher, 7 nodes (``TEACHER_TEMPLATES`` holds the six prompts, editable per agent through
``agent.templates``)::

    is_form_selected (no LLM) -> intent_discovery                      (no form selected yet)
                              -> gather_values -> verify_values -> update_and_plan
                                 -> plan_next -> generate               (a form is selected)

Student, 3 nodes (``STUDENT_TEMPLATES``: short prompts, the form in a compact form)::

    is_form_selected (no LLM) -> intent_discovery | respond

Each LLM node writes a JSON list of steps (``render.py``; once a form is selected, a
``function`` field naming it may be left out); a node that writes an action routes
the next turn back to ``is_form_selected``. An output that cannot be parsed, or that does not
end the turn where it must (``generate``, ``respond`` and ``intent_discovery`` end with one
action), becomes an :class:`~tapekit.structured.LLMOutputParsingFailure` step and a
``StopStep``: the turn is over and scores zero. ``is_form_selected`` stops the agent once the
form is submitted or the dialogue ended.

Templates are format strings over the sections of :class:`~examples.form_filler.render.TurnContext`
(``{form}``, ``{filled}``, ``{last_user}``, ...); ``templates["system"]`` is the system message.

The student's two baselines (``run.py``): ``make_student(llm, constrain=True)`` puts each LLM
node's output grammar, :func:`output_schema`, in the prompt's ``response_schema`` (llama.cpp
and transformers decode under it, see :class:`~tapekit.llm.LlamaCppLLM`), and
``make_student(llm, demos={node: [(prompt, output), ...]})`` shows each node worked examples
as earlier chat turns (few-shot; :func:`~examples.form_filler.distill.few_shot_demos` picks them
from training tapes).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any

from examples.form_filler.render import parse_step_list, steps_json, turn_context
from examples.form_filler.state import form_state
from examples.form_filler.steps import (
    AnswerFromFunctionSchemaThought,
    CallFunctionAction,
    ExitAction,
    GatherValuesThought,
    InspectFunctionAction,
    NoAnswerInFunctionSchemaThought,
    PromptUserForTextMessageAction,
    RefuseInexistentFunctionThought,
    RefuseInvalidFunctionParameterValueThought,
    RefuseSkippingParameterThought,
    RefuseToEngageThought,
    RequestExitConfirmationThought,
    RequestFunctionCallConfirmationThought,
    RequestFunctionParametersThought,
    RequestFunctionThought,
    ResolveFunctionAction,
    UpdateFunctionParametersThought,
    VerifyValuesThought,
)
from tapekit import (
    Action,
    Agent,
    LLMOutput,
    LLMOutputParsingFailure,
    Node,
    Prompt,
    SetNextNode,
    Step,
    StepParsingError,
    StopStep,
    Tape,
    UserStep,
    node_run_steps,
    steps_schema,
)
from tapekit.llm import LLM, LLMStream

__all__ = [
    "INTENT_STEPS",
    "MAX_THOUGHTS",
    "RESPOND_STEPS",
    "STUDENT_TEMPLATES",
    "TEACHER_TEMPLATES",
    "FormNode",
    "IsFormSelected",
    "make_student",
    "make_teacher",
    "output_schema",
]

SYSTEM = (
    "You are a form-filling assistant for employees of a company. You help the user find the "
    "right request form, fill its fields from what they say, and submit it. You only talk about "
    "the company's forms, and everything you say must follow from the form documentation and "
    "the conversation."
)
_JSON = 'Answer with a JSON list of step objects, each with its "kind", and nothing else.'

TEACHER_TEMPLATES: dict[str, str] = {
    "system": SYSTEM,
    "intent_discovery": (
        "Task: intent discovery.\n"
        "If the available forms have not been looked up since the user's last message, write one "
        "resolve_function step. Otherwise, if the user's last message asks for one of the forms, "
        "write one inspect_function step naming it. If it asks for something no form does, write "
        "refuse_inexistent_function, then request_function listing every form, then "
        "prompt_user_for_text_message saying what you can help with. If the user asks what you "
        "can do, write request_function and prompt_user_for_text_message.\n"
        "## Forms\n{forms}\n## Dialogue\n{dialogue}\n## Last user message\n{last_user}\n" + _JSON
    ),
    "gather_values": (
        "Task: gather raw values.\n"
        "Write one gather_values step whose parameters map each field of the form that the user's "
        "last message gives a value for to that value, exactly as the user gave it (an option "
        "given by its position means that option). A bare answer is the value of the field the "
        "assistant asked for. Leave out requests to skip a field, and questions.\n"
        "## Form\n{form}\n## Filled\n{filled}\n## The assistant asked for\n{asked}\n"
        "## Dialogue\n{dialogue}\n## Last user message\n{last_user}\n" + _JSON
    ),
    "verify_values": (
        "Task: verify values.\n"
        "Write one verify_values step: for each gathered value, its status (valid or invalid) "
        "against the form's documentation (allowed values, dates as YYYY-MM-DD that exist, "
        "well-formed email addresses) and an explanation when invalid.\n"
        "## Form\n{form}\n## This turn so far\n{thoughts}\n" + _JSON
    ),
    "update_and_plan": (
        "Task: update the fields and plan the response.\n"
        "Write update_function_parameters with the valid NEW values (assign) and the optional "
        "fields the user asks to skip (skip), if any; refuse_invalid_function_parameter_value for "
        "each invalid value; refuse_skipping_parameter for each required field the user asks to "
        "skip; answer_from_function_schema if the user asks a question the documentation or the "
        "filled fields answer, no_answer_in_function_schema if they do not; refuse_to_engage if "
        "the user talks about something else. Write [] if none applies.\n"
        "## Form\n{form}\n## Filled\n{filled}\n## Skipped\n{skipped}\n"
        "## The assistant asked for\n{asked}\n## Last user message\n{last_user}\n"
        "## This turn so far\n{thoughts}\n" + _JSON
    ),
    "plan_next": (
        "Task: plan the next request.\n"
        "If the user confirmed the submission and no required field is missing, write []. "
        "Otherwise write one request_function_parameters step for the next field neither filled "
        "nor skipped (the one asked for before if it is still empty), or "
        "request_function_call_confirmation when every field is filled or skipped.\n"
        "## Form\n{form}\n## Filled\n{filled}\n## Skipped\n{skipped}\n"
        "## The assistant asked for\n{asked}\n## Last user message\n{last_user}\n"
        "## This turn so far\n{thoughts}\n" + _JSON
    ),
    "generate": (
        "Task: respond.\n"
        "Write one action. If this turn planned nothing and the user confirmed, call_function. "
        "Otherwise prompt_user_for_text_message: acknowledge every value set or skipped, explain "
        "every refusal, answer the question from the documentation, then ask what was planned, "
        "giving the allowed values, the default and whether the field is optional.\n"
        "## Form\n{form}\n## Filled\n{filled}\n## Skipped\n{skipped}\n"
        "## Last user message\n{last_user}\n## This turn so far\n{thoughts}\n" + _JSON
    ),
}
"""The teacher's prompts: long, one task per node, the full schema and dialogue."""

STUDENT_TEMPLATES: dict[str, str] = {
    "system": "You fill company request forms with the user. Reply with a JSON list of steps.",
    "intent_discovery": "Find the form.\nforms: {form_names}\nuser: {last_user}",
    "respond": ("{form_compact}\nfilled: {filled}\nskipped: {skipped}\nasked: {asked}\nuser: {last_user}"),
}
"""The student's prompts: short, the form in one line per field."""

INTENT_STEPS: list[type[Step]] = [
    ResolveFunctionAction,
    InspectFunctionAction,
    RefuseInexistentFunctionThought,
    RequestFunctionThought,
    PromptUserForTextMessageAction,
]
"""What intent discovery may write."""

UPDATE_STEPS: list[type[Step]] = [
    UpdateFunctionParametersThought,
    RefuseInvalidFunctionParameterValueThought,
    RefuseSkippingParameterThought,
    AnswerFromFunctionSchemaThought,
    NoAnswerInFunctionSchemaThought,
    RefuseToEngageThought,
]
PLAN_STEPS: list[type[Step]] = [
    RequestFunctionParametersThought,
    RequestFunctionCallConfirmationThought,
    RequestExitConfirmationThought,
]
GENERATE_STEPS: list[type[Step]] = [PromptUserForTextMessageAction, CallFunctionAction, ExitAction]
RESPOND_STEPS: list[type[Step]] = [*UPDATE_STEPS, *PLAN_STEPS, *GENERATE_STEPS]
"""What the student's single slot-filling node may write."""

MAX_THOUGHTS = 4
"""The most thoughts :func:`output_schema` lets a turn-ending node write before its action (the
teacher's tapes have at most 3)."""
TEXT_CHARACTERS = 400
"""The longest message (``prompt``, ``text``) the output grammar allows (the teacher's: 332)."""
NAME_CHARACTERS = 100
"""The longest other string (a form or slot name, a value, a query) the output grammar allows."""
_TEXT_FIELDS = {"prompt", "text"}


def _text(limit: int) -> dict[str, Any]:
    """A string of at most ``limit`` characters, none a control character, a quote or a
    backslash: as a ``pattern``, which llama.cpp's schema converter honours (its own string rule
    lets raw control characters through, which no JSON parser accepts) and llguidance too."""
    return {"type": "string", "maxLength": limit, "pattern": f'^[^"\\\\\\x00-\\x1F\\x7F]{{0,{limit}}}$'}


def _tighten(schema: Any, field: str = "") -> Any:
    """``schema`` with every string bounded (messages to :data:`TEXT_CHARACTERS`, the rest to
    :data:`NAME_CHARACTERS`; see :func:`_text`) and every free value (``Any``: a slot's value) a
    bounded string: every slot of every form is a JSON string (``schema.py``)."""
    if isinstance(schema, list):
        return [_tighten(s, field) for s in schema]
    if not isinstance(schema, dict):
        return schema
    limit = TEXT_CHARACTERS if field in _TEXT_FIELDS else NAME_CHARACTERS
    free = not (set(schema) - {"title", "description", "default"})
    if free:  # Any
        return _text(limit)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("title", "description"):
            continue
        if key == "properties":
            out[key] = {name: _tighten(sub, name) for name, sub in value.items()}
        elif key == "additionalProperties" and value is True:
            out[key] = _text(NAME_CHARACTERS)
        elif key in ("items", "additionalProperties", "anyOf"):
            out[key] = _tighten(value, field)
        else:
            out[key] = value
    if out.get("type") == "string" and "const" not in out and "enum" not in out:
        out = {**out, **_text(limit)}
    if out.get("type") == "array" and "maxItems" not in out:
        out["maxItems"] = 10  # a company has 10 forms; a form fewer slots
    return out


def output_schema(
    step_classes: Sequence[type[Step]],
    *,
    ends_turn: bool = True,
    allow_empty: bool = False,
    form_selected: bool = False,
    max_thoughts: int = MAX_THOUGHTS,
) -> dict[str, Any]:
    """The JSON schema of what a :class:`FormNode` writes: a JSON list of step objects of
    ``step_classes`` (each step's schema is :func:`tapekit.structured.steps_schema`'s, its
    strings bounded, a slot's value a string). ``ends_turn``: up to ``max_thoughts`` thoughts,
    then exactly one action (what :meth:`FormNode.parse` accepts); otherwise thoughts only (an
    empty list only with ``allow_empty``). ``form_selected``: a ``function`` field may be left
    out (it then names the selected form). Put in a prompt's ``response_schema``, llama.cpp
    and transformers decode under it, so every complete answer parses."""
    text = _output_schema_json(tuple(step_classes), ends_turn, allow_empty, form_selected, max_thoughts)
    schema: dict[str, Any] = json.loads(text)
    return schema


@functools.lru_cache(maxsize=64)
def _output_schema_json(
    step_classes: tuple[type[Step], ...],
    ends_turn: bool,
    allow_empty: bool,
    form_selected: bool,
    max_thoughts: int,
) -> str:
    """:func:`output_schema` as JSON text, once per set of arguments (pydantic's schemas of the
    step classes take about 20 ms; every constrained prompt asks for one)."""
    thoughts: list[dict[str, Any]] = []
    actions: list[dict[str, Any]] = []
    for cls in step_classes:
        variant = _tighten(steps_schema([cls])["properties"]["steps"]["items"])
        if form_selected:
            variant["required"] = [r for r in variant.get("required", []) if r != "function"]
        (actions if issubclass(cls, Action) else thoughts).append(variant)
    defs: dict[str, Any] = {}
    if thoughts:
        defs["thought"] = thoughts[0] if len(thoughts) == 1 else {"anyOf": thoughts}
    if actions:
        defs["action"] = actions[0] if len(actions) == 1 else {"anyOf": actions}
    if ends_turn:
        if not actions:
            raise ValueError("a node that ends the turn needs at least one action among its step classes")
        most = max_thoughts if thoughts else 0
        lists = [
            {
                "type": "array",
                "prefixItems": [{"$ref": "#/$defs/thought"}] * n + [{"$ref": "#/$defs/action"}],
                "items": False,
                "minItems": n + 1,
                "maxItems": n + 1,
            }
            for n in range(most + 1)
        ]
        schema: dict[str, Any] = lists[0] if len(lists) == 1 else {"anyOf": lists}
    else:
        if not thoughts:
            raise ValueError("a node that does not end the turn writes thoughts only; it has none")
        schema = {
            "type": "array",
            "items": {"$ref": "#/$defs/thought"},
            "minItems": 0 if allow_empty else 1,
            "maxItems": max_thoughts,
        }
    return json.dumps({**schema, "$defs": defs})


_START = "is_form_selected"


class IsFormSelected(Node):
    """Routes without an LLM: to ``filling_node`` once a form's schema is on the tape, else to
    ``intent_node``; stops the agent when the dialogue is over (submitted or exited)."""

    name: str = _START
    filling_node: str = "gather_values"
    intent_node: str = "intent_discovery"

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """One ``SetNextNode``, or a ``StopStep`` when the dialogue is over."""
        state = form_state(tape.steps)
        if state.ended:
            yield StopStep(reason="submitted" if state.submitted else "dialogue ended")
        elif state.form_selected:
            yield SetNextNode(next_node=self.filling_node)
        else:
            yield SetNextNode(next_node=self.intent_node)


def _agent_steps(tape: Tape[Any, Any], index: int) -> list[Step]:
    """The agents' steps from ``index`` up to the next step made by no agent."""
    out = []
    for step in tape.steps[index:]:
        if not step.metadata.agent:
            break
        out.append(step)
    return out


class FormNode(Node):
    """An LLM node: renders ``agent.templates[name]`` with the tape's sections, parses the
    output (a JSON list of ``step_classes``). ``ends_turn``: the output must end with exactly one
    action (then the next turn starts at ``is_form_selected``); otherwise it may not contain
    one. ``allow_empty``: ``[]`` is a valid output (the next node runs).

    ``whole_turn``: ``make_llm_output`` reads every agent step up to the next observation
    instead of this node run's steps: the student's ``respond`` node rebuilds, from a teacher
    tape, what the teacher's last three nodes wrote.

    ``demos``: worked examples, ``(prompt, output)`` pairs shown as earlier user and assistant
    turns between the system message and the prompt (few-shot). ``constrain``: the prompt's
    ``response_schema`` is :func:`output_schema` (decoding under the output grammar)."""

    step_classes: list[type[Step]]
    ends_turn: bool = False
    allow_empty: bool = False
    whole_turn: bool = False
    demos: list[tuple[str, str]] = []
    constrain: bool = False

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        """The system message, the demos (if any) and this node's template over the tape's
        sections; with ``constrain``, the output grammar as the response schema."""
        try:
            template = agent.templates[self.name]
        except KeyError:
            raise KeyError(f"agent {agent.name!r} has no template {self.name!r} for its node") from None
        user = template.format(**turn_context(tape).sections())
        messages = [{"role": "system", "content": agent.templates.get("system", SYSTEM)}]
        for prompt, output in self.demos:
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
        schema = None
        if self.constrain:
            schema = output_schema(
                self.step_classes,
                ends_turn=self.ends_turn,
                allow_empty=self.allow_empty,
                form_selected=bool(_selected(tape.steps)),
            )
        return Prompt(messages=[*messages, {"role": "user", "content": user}], response_schema=schema)

    def parse(self, text: str, function: str = "") -> list[Step]:
        """The steps of ``text`` (``function``: the selected form, for the ``function`` fields
        left out); :class:`StepParsingError` when they are not what this node may write."""
        steps = parse_step_list(text.strip(), self.step_classes, self.allow_empty, function)
        actions = [i for i, s in enumerate(steps) if isinstance(s, Action)]
        if self.ends_turn and actions != [len(steps) - 1]:
            raise StepParsingError("the output must end with exactly one action (and have no other)")
        if not self.ends_turn and actions:
            raise StepParsingError(f"node {self.name} writes no actions")
        return steps

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The parsed steps (after a routing step back to ``is_form_selected`` when they end the
        turn), or a parsing failure and a stop."""
        text = llm_stream.get_text()
        try:
            steps = self.parse(text, _selected(tape.steps))
        except StepParsingError as e:
            yield LLMOutputParsingFailure(error=str(e), raw=text)
            yield StopStep(reason="unparsable output")
            return
        steps = [_default_query(s, tape) for s in steps]
        if self.ends_turn:
            yield SetNextNode(next_node=_START)
        elif not steps:
            names = [n.name for n in agent.nodes]
            yield SetNextNode(next_node=names[names.index(self.name) + 1])
        yield from steps

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The JSON list that makes the run's steps (or the whole turn's, see ``whole_turn``)."""
        run = _agent_steps(tape, index) if self.whole_turn else node_run_steps(tape, index)
        failure = next((s for s in run if isinstance(s, LLMOutputParsingFailure)), None)
        if failure is not None:
            return LLMOutput(content=failure.raw)
        written = [_written_query(s, tape, index) for s in run if not isinstance(s, StopStep)]
        return LLMOutput(content=steps_json(written, _selected(tape.steps[:index])))


def _selected(steps: Any) -> str:
    """The name of the form selected on ``steps`` ('' if none)."""
    schema = form_state(steps).schema
    return schema.name if schema is not None else ""


def _last_user_text(steps: Any) -> str:
    for step in reversed(list(steps)):
        if isinstance(step, UserStep):
            return step.content
    return ""


def _default_query(step: Step, tape: Tape[Any, Any]) -> Step:
    """A ``resolve_function`` without a query resolves the user's last message (appendix E.2)."""
    if isinstance(step, ResolveFunctionAction) and not step.query:
        return step.model_copy(update={"query": _last_user_text(tape.steps)})
    return step


def _written_query(step: Step, tape: Tape[Any, Any], index: int) -> Step:
    """The inverse of :func:`_default_query` for the step at ``index`` of ``tape``."""
    if isinstance(step, ResolveFunctionAction) and step.query == _last_user_text(tape.steps[:index]):
        return step.model_copy(update={"query": ""})
    return step


def make_teacher(llm: LLM, templates: dict[str, str] | None = None, name: str = "teacher") -> Agent:
    """The 7-node teacher on ``llm`` (e.g. ``FunctionLLM(fn=Oracle())``); ``templates``
    replaces some of :data:`TEACHER_TEMPLATES`."""
    nodes: list[Node] = [
        IsFormSelected(filling_node="gather_values"),
        FormNode(name="intent_discovery", step_classes=INTENT_STEPS, ends_turn=True, whole_turn=True),
        FormNode(name="gather_values", step_classes=[GatherValuesThought]),
        FormNode(name="verify_values", step_classes=[VerifyValuesThought]),
        FormNode(name="update_and_plan", step_classes=UPDATE_STEPS, allow_empty=True),
        FormNode(name="plan_next", step_classes=PLAN_STEPS, allow_empty=True),
        FormNode(name="generate", step_classes=GENERATE_STEPS, ends_turn=True),
    ]
    return Agent.create(name, llms=llm, nodes=nodes, templates={**TEACHER_TEMPLATES, **(templates or {})})


def make_student(
    llm: LLM,
    templates: dict[str, str] | None = None,
    name: str = "student",
    *,
    demos: dict[str, list[tuple[str, str]]] | None = None,
    constrain: bool = False,
) -> Agent:
    """The 3-node student on ``llm``; ``templates`` replaces some of :data:`STUDENT_TEMPLATES`.
    ``demos`` maps a node (``intent_discovery``, ``respond``) to its worked examples (few-shot);
    ``constrain`` decodes both LLM nodes under their output grammar (see :class:`FormNode`)."""
    shown = demos or {}
    unknown = set(shown) - {"intent_discovery", "respond"}
    if unknown:
        raise ValueError(f"demos for unknown student nodes: {sorted(unknown)}")
    nodes: list[Node] = [
        IsFormSelected(filling_node="respond"),
        *(
            FormNode(
                name=name,
                step_classes=steps,
                ends_turn=True,
                whole_turn=True,
                demos=shown.get(name, []),
                constrain=constrain,
            )
            for name, steps in (("intent_discovery", INTENT_STEPS), ("respond", RESPOND_STEPS))
        ),
    ]
    return Agent.create(name, llms=llm, nodes=nodes, templates={**STUDENT_TEMPLATES, **(templates or {})})
