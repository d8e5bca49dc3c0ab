"""Make a company and its forms with any LLM, in the three prompted steps of appendix E.1.

1. describe a real company under a made-up name (the company's description);
2. list ``n_forms`` request forms of that company as JSON (name and description each);
3. for each form, write its full :class:`FunctionSchema` in YAML (or JSON): a detailed
   description with the rules of the request, required and optional flat parameters, a
   return value.

Every answer is checked by program: the list must parse as JSON, each schema must parse, fit
the :class:`FunctionSchema` model and pass :func:`check_function_schema`; a failed step is asked
again (``max_attempts``), and :class:`GenerationError` says what was wrong with the last try.
Colons left in a description are replaced (the prompt asks for none; the agents' prompts use
colons as separators).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from pydantic import ValidationError

from examples.form_filler.schema import Company, FunctionSchema, check_function_schema
from tapekit import Prompt
from tapekit.llm import LLM

__all__ = [
    "GenerationError",
    "agenerate_company",
    "description_prompt",
    "forms_prompt",
    "generate_company",
    "parse_form_list",
    "parse_function_schema",
    "schema_prompt",
]

SYSTEM_MESSAGE = """You are an enterprise assistant connected to the internal systems of {company}.
Through them you can read the REQUEST_FORMS of {company}: employees and clients submit them to ask
for something and to start automations. A REQUEST_FORM is described by this data model:
```python
class FunctionSchema(BaseModel):
    name: str  # the form's identifier
    description: str  # what the form is for, and its rules
    parameters: JsonSchema  # the JSON schema of the form's fields
    return_value: JsonSchema  # the JSON schema of what submitting the form returns
```"""

_FENCE = re.compile(r"```[a-zA-Z]*\n(.*?)```", re.S)


class GenerationError(ValueError):
    """An LLM answer could not be used, after every attempt; the message says why."""


def description_prompt(real_name: str, fake_name: str) -> Prompt:
    """Step 1: a description of ``real_name`` with every mention replaced by ``fake_name``."""
    return Prompt(
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": f"Describe the company {real_name}, writing `{fake_name}` wherever "
                f"the name `{real_name}` would appear.",
            },
        ]
    )


def forms_prompt(fake_name: str, description: str, n_forms: int = 10) -> Prompt:
    """Step 2: ``n_forms`` request forms of the company, as a JSON list of name/description."""
    return Prompt(
        messages=[
            {"role": "system", "content": SYSTEM_MESSAGE.format(company=fake_name)},
            {
                "role": "user",
                "content": f"The company is '{fake_name}'.\n{description}\n"
                f"List {n_forms} REQUEST_FORMS that people at {fake_name} use often, specific to "
                f"what {fake_name} does. Answer with a JSON list of objects with the keys 'name' "
                "and 'description', and nothing else; it must parse as JSON.",
            },
        ]
    )


def schema_prompt(fake_name: str, description: str, form: dict[str, str]) -> Prompt:
    """Step 3: the full FunctionSchema of one form, in YAML."""
    return Prompt(
        messages=[
            {"role": "system", "content": SYSTEM_MESSAGE.format(company=fake_name)},
            {
                "role": "user",
                "content": f"The company is '{fake_name}'.\n{description}\n"
                f"Write the FunctionSchema of this REQUEST_FORM:\n```json\n{json.dumps(form)}\n```\n"
                f"First make the description more specific: state the rules, facts and policies of "
                f"{fake_name} about {form.get('name', 'this form')} (when to use it, who processes "
                "it, ...), help the user fill each field, and explain how the choices of every "
                "multiple-choice field (enum) differ. Use no colon characters in it.\n"
                "Then write the FunctionSchema in YAML with that description. Every field is a "
                "string, either free text, an enum, or with format date or email; fields are not "
                "nested (the return value may be). Include both required and optional fields; "
                "optional ones may have a default. The output must parse as a FunctionSchema.",
            },
        ]
    )


def _payload(text: str) -> str:
    found = _FENCE.search(text)
    return (found.group(1) if found else text).strip()


def parse_form_list(text: str, n_forms: int | None = None) -> list[dict[str, str]]:
    """The forms of a step-2 answer; ``GenerationError`` if it is not a JSON list of objects with
    string ``name`` and ``description`` (of length ``n_forms`` when given)."""
    try:
        data = json.loads(_payload(text))
    except json.JSONDecodeError as e:
        raise GenerationError(f"the form list is not JSON: {e}") from e
    if not isinstance(data, list):
        raise GenerationError(f"the form list must be a JSON list, got {type(data).__name__}")
    for i, item in enumerate(data):
        ok = isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("name", "description"))
        if not ok:
            raise GenerationError(f"form {i} needs string 'name' and 'description', got {item!r}")
    if n_forms is not None and len(data) != n_forms:
        raise GenerationError(f"expected {n_forms} forms, got {len(data)}")
    return [{"name": d["name"], "description": d["description"]} for d in data]


def _load(text: str) -> Any:
    payload = _payload(text)
    try:
        return json.loads(payload)
    except json.JSONDecodeError:
        pass
    try:
        import yaml
    except ImportError as e:
        raise GenerationError(
            "the schema is not JSON, and reading YAML needs pyyaml (pip install pyyaml)"
        ) from e
    try:
        return yaml.safe_load(payload)
    except yaml.YAMLError as e:
        raise GenerationError(f"the schema is neither JSON nor YAML: {e}") from e


def parse_function_schema(text: str) -> FunctionSchema:
    """The FunctionSchema of a step-3 answer (YAML or JSON, fenced or not), checked;
    ``GenerationError`` listing every problem otherwise."""
    data = _load(text)
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), dict):
        inner = next(iter(data.values()))
        if "parameters" in inner:  # {"FunctionSchema": {...}}
            data = inner
    if not isinstance(data, dict):
        raise GenerationError(f"the schema must be a mapping, got {type(data).__name__}")
    if isinstance(data.get("description"), str):
        data["description"] = data["description"].replace(":", " -").strip()
    try:
        schema = FunctionSchema.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise GenerationError(f"the schema does not fit FunctionSchema: {problems}") from e
    problems_list = check_function_schema(schema)
    if problems_list:
        raise GenerationError("the schema is invalid: " + "; ".join(problems_list))
    return schema


async def _ask(llm: LLM, prompt: Prompt, parse: Any, max_attempts: int, what: str) -> Any:
    error: Exception | None = None
    for _ in range(max_attempts):
        output = await llm.agenerate(prompt)
        try:
            return parse(output.content or "")
        except GenerationError as e:
            error = e
    raise GenerationError(f"{what}: no usable answer in {max_attempts} attempts; last problem: {error}")


async def agenerate_company(
    llm: LLM, real_name: str, fake_name: str, n_forms: int = 10, max_attempts: int = 3
) -> Company:
    """A company named ``fake_name`` modelled on ``real_name``, with ``n_forms`` checked forms."""

    def describe(text: str) -> str:
        if not text.strip():
            raise GenerationError("the description is empty")
        return text.strip()

    description = await _ask(llm, description_prompt(real_name, fake_name), describe, max_attempts, "step 1")
    forms = await _ask(
        llm,
        forms_prompt(fake_name, description, n_forms),
        lambda text: parse_form_list(text, n_forms),
        max_attempts,
        "step 2",
    )
    schemas = [
        await _ask(
            llm,
            schema_prompt(fake_name, description, form),
            parse_function_schema,
            max_attempts,
            f"step 3 ({form['name']})",
        )
        for form in forms
    ]
    return Company(name=fake_name, description=description, forms=schemas)


def generate_company(
    llm: LLM, real_name: str, fake_name: str, n_forms: int = 10, max_attempts: int = 3
) -> Company:
    """Sync version of :func:`agenerate_company`."""
    return asyncio.run(agenerate_company(llm, real_name, fake_name, n_forms, max_attempts))
