"""Companies, forms and their schemas: the form filler's environment data, and its validators.

A company offers request forms; each form is a :class:`FunctionSchema` (the paper's name for
it): a name, a description with the rules of the request, a JSON schema of its parameters
(the *slots*) and a JSON schema of what a submission returns. Every parameter is a JSON string
of one of four kinds:

- ``categorical``: ``{"type": "string", "enum": [...]}``;
- ``date``: ``{"type": "string", "format": "date"}`` (ISO ``YYYY-MM-DD``);
- ``email``: ``{"type": "string", "format": "email"}``;
- ``string``: free text.

A parameter listed in ``required`` must be given; the others are optional and may carry a
``default``. :func:`check_function_schema` and :func:`check_form_set` list everything wrong
with a schema or a set of companies; :func:`check_value` and :func:`check_call` check the values
a user gives (what the environment does before it submits a form).
"""

from __future__ import annotations

import json
import re
from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DATA_DIR",
    "Company",
    "FormSet",
    "FunctionSchema",
    "ParameterSchema",
    "ParametersSchema",
    "SlotKind",
    "check_call",
    "check_form_set",
    "check_function_schema",
    "check_value",
    "load_form_set",
]

DATA_DIR = Path(__file__).parent / "data"

SlotKind = Literal["categorical", "date", "email", "string"]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_EMAIL = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class ParameterSchema(BaseModel):
    """One slot of a form, as a JSON-schema property (always ``"type": "string"``)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["string"] = "string"
    description: str
    enum: list[str] | None = None
    format: Literal["date", "email"] | None = None
    default: str | None = None
    examples: list[str] | None = None

    @property
    def slot_kind(self) -> SlotKind:
        """``categorical``, ``date``, ``email`` or ``string``."""
        if self.enum is not None:
            return "categorical"
        return self.format or "string"


class ParametersSchema(BaseModel):
    """The JSON schema of a form's parameters: an object of string properties, flat."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["object"] = "object"
    properties: dict[str, ParameterSchema]
    required: list[str] = Field(default_factory=list)


class FunctionSchema(BaseModel):
    """A request form: ``name``, ``description``, ``parameters`` (the slots) and
    ``return_value`` (the JSON schema of a submission's result; it may nest)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    parameters: ParametersSchema
    return_value: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    def is_required(self, parameter: str) -> bool:
        """Whether ``parameter`` must be given (it cannot be skipped)."""
        return parameter in self.parameters.required

    def parameter(self, name: str) -> ParameterSchema:
        """The schema of parameter ``name``; ``KeyError`` naming the form's parameters if none."""
        try:
            return self.parameters.properties[name]
        except KeyError:
            known = ", ".join(self.parameters.properties)
            raise KeyError(f"form {self.name} has no parameter {name!r} (it has: {known})") from None

    def names_of_kind(self, kind: SlotKind) -> list[str]:
        """The parameters of one slot kind, in schema order."""
        return [n for n, p in self.parameters.properties.items() if p.slot_kind == kind]

    def json_schema(self) -> dict[str, Any]:
        """The schema as plain JSON data (no ``null`` fields), as an agent's prompt shows it."""
        return self.model_dump(mode="json", exclude_none=True)


class Company(BaseModel):
    """A made-up company and the request forms it offers."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    forms: list[FunctionSchema]

    def form(self, name: str) -> FunctionSchema:
        """The form called ``name``; ``KeyError`` listing the company's forms if none."""
        for form in self.forms:
            if form.name == name:
                return form
        raise KeyError(f"{self.name} has no form {name!r} (it has: {', '.join(f.name for f in self.forms)})")


class FormSet(BaseModel):
    """Companies split into the training and the test domains."""

    model_config = ConfigDict(extra="forbid")

    train: list[Company]
    test: list[Company]

    def company(self, name: str) -> Company:
        """The company called ``name`` (either split)."""
        for company in [*self.train, *self.test]:
            if company.name == name:
                return company
        raise KeyError(f"no company {name!r} in this form set")


def check_value(parameter: ParameterSchema, value: Any) -> str | None:
    """Why ``value`` is not valid for ``parameter``, or ``None`` when it is."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__} {value!r}"
    kind = parameter.slot_kind
    if kind == "categorical":
        assert parameter.enum is not None
        if value not in parameter.enum:
            return f"{value!r} is not one of the allowed values: {', '.join(parameter.enum)}"
    elif kind == "date":
        if not _ISO_DATE.match(value):
            return f"{value!r} is not a date in the format YYYY-MM-DD"
        try:
            date.fromisoformat(value)
        except ValueError as e:
            return f"{value!r} is not a valid date ({e})"
    elif kind == "email":
        if not _EMAIL.match(value):
            return f"{value!r} is not a valid email address"
    elif not value.strip():
        return "must not be empty"
    return None


def check_call(schema: FunctionSchema, arguments: dict[str, Any]) -> list[str]:
    """Every problem with submitting ``schema`` with ``arguments`` (empty when it can be submitted):
    unknown parameters, missing required ones, and invalid values, each naming the parameter."""
    problems = [
        f"{name}: no such parameter in {schema.name}"
        for name in arguments
        if name not in schema.parameters.properties
    ]
    for name in schema.parameters.required:
        if arguments.get(name) is None:
            problems.append(f"{name}: required but missing")
    for name, value in arguments.items():
        parameter = schema.parameters.properties.get(name)
        if parameter is not None and value is not None and (why := check_value(parameter, value)):
            problems.append(f"{name}: {why}")
    return problems


def check_function_schema(schema: FunctionSchema) -> list[str]:
    """Every problem with a form's schema, each prefixed by where it is (empty when valid).

    A valid form has an identifier-like name, a description without colons (appendix E.1), at
    least one required and one optional parameter, categorical parameters with two or more
    distinct values, defaults only on optional parameters and valid for their kind, and an
    object ``return_value``.
    """
    where = schema.name or "<unnamed form>"
    problems: list[str] = []
    if not _NAME.match(schema.name):
        problems.append(f"{where}: name must be an identifier (letters, digits, _)")
    if not schema.description.strip():
        problems.append(f"{where}: empty description")
    if ":" in schema.description:
        problems.append(f"{where}: description contains a colon")
    props = schema.parameters.properties
    if not props:
        problems.append(f"{where}: no parameters")
    for name in schema.parameters.required:
        if name not in props:
            problems.append(f"{where}.{name}: listed as required but not a parameter")
    if len(set(schema.parameters.required)) != len(schema.parameters.required):
        problems.append(f"{where}: a parameter is listed twice in required")
    if props and not any(n in props for n in schema.parameters.required):
        problems.append(f"{where}: no required parameter")
    if props and all(n in schema.parameters.required for n in props):
        problems.append(f"{where}: no optional parameter")
    for name, parameter in props.items():
        problems += [
            f"{where}.{name}: {p}" for p in _check_parameter(name, parameter, schema.is_required(name))
        ]
    if schema.return_value.get("type") != "object":
        problems.append(f"{where}: return_value must be a JSON schema of type object")
    return problems


def _check_parameter(name: str, parameter: ParameterSchema, required: bool) -> list[str]:
    problems = []
    if not _NAME.match(name):
        problems.append("name must be an identifier")
    if not parameter.description.strip():
        problems.append("empty description")
    if parameter.enum is not None:
        if parameter.format is not None:
            problems.append("a categorical parameter has no format")
        if len(set(parameter.enum)) < 2 or len(set(parameter.enum)) != len(parameter.enum):
            problems.append("enum needs two or more distinct values")
    if parameter.default is not None:
        if required:
            problems.append("a required parameter has no default (a default makes it optional)")
        if why := check_value(parameter, parameter.default):
            problems.append(f"default {why}")
    for example in parameter.examples or []:
        if why := check_value(parameter, example):
            problems.append(f"example {why}")
    return problems


def check_form_set(forms: FormSet, forms_per_company: int | None = 10, all_kinds: bool = False) -> list[str]:
    """Every problem with a set of companies: each schema's (:func:`check_function_schema`),
    duplicate company or form names, a company whose form count is not ``forms_per_company``,
    and with ``all_kinds`` a form lacking one of the four slot kinds."""
    problems: list[str] = []
    companies = [*forms.train, *forms.test]
    names = [c.name for c in companies]
    problems += [f"company {n} appears twice" for n in sorted({n for n in names if names.count(n) > 1})]
    for company in companies:
        if not company.description.strip():
            problems.append(f"{company.name}: empty description")
        if forms_per_company is not None and len(company.forms) != forms_per_company:
            problems.append(f"{company.name}: {len(company.forms)} forms, expected {forms_per_company}")
        form_names = [f.name for f in company.forms]
        problems += [
            f"{company.name}: form {n} appears twice"
            for n in sorted(set(form_names))
            if form_names.count(n) > 1
        ]
        for form in company.forms:
            problems += [f"{company.name}/{p}" for p in check_function_schema(form)]
            if all_kinds:
                kinds = {p.slot_kind for p in form.parameters.properties.values()}
                missing = {"categorical", "date", "email", "string"} - kinds
                if missing:
                    problems.append(f"{company.name}/{form.name}: no {', '.join(sorted(missing))} parameter")
    return problems


def load_form_set(directory: Path | str = DATA_DIR) -> FormSet:
    """The companies in ``directory``/train.json and test.json (the bundled set by default)."""
    directory = Path(directory)
    splits = {}
    for split in ("train", "test"):
        path = directory / f"{split}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} is missing: run examples/form_filler/make_forms.py") from None
        splits[split] = [Company.model_validate(c) for c in data["companies"]]
    return FormSet(**splits)
