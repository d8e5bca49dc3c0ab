"""A fixed list of named variants of the targeted nodes, each scored on the validation tasks.

Where :class:`~tapekit.optimize.BootstrapFewShot` draws demo sets at random and
:class:`~tapekit.optimize.Reflective` proposes instructions, :class:`VariantSearch` scores the
configurations you name: how many demos, how they are picked per prompt, a node option such as
the rationale on or off, an instruction's wording. It is the grid a practitioner would try by
hand, run within the budget and kept like any other optimiser's candidates, so
:func:`~tapekit.optimize.optimize` picks the best on validation and scores it on the test split
once.

Demos come from one pool: the training tasks are run once (by the ``teacher`` when given, else
by the base agent) and each variant reads the passed tapes through its own node (a variant
whose node writes no rationale reads the teacher's runs without their thoughts). A variant's
``demos`` says what it takes from the pool:

- ``"none"``: no demos;
- ``"pool"``: the whole pool, shown per prompt through the node's ``demo_pick`` option
  (:class:`~tapekit.frameworks.DemoPick`: ``k`` demos nearest the input, so each episode sees
  demos of its own task), or every demo in every prompt when the variant sets no pick;
- an int ``n``: a seeded random ``n`` of the pool, the same in every prompt.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tapekit.agent import Agent
from tapekit.evaluate import EvalReport
from tapekit.optimize._run import Search
from tapekit.optimize._targets import NodeParams, Params
from tapekit.optimize.base import Optimizer
from tapekit.optimize.demos import bootstrap_report, pool_from_report, sample_demos


class Variant(BaseModel):
    """One named configuration of the target nodes (see the module docstring for ``demos``).

    ``instruction`` replaces the nodes' instruction when set; ``options`` sets other node
    fields by name on every target (checked against each field's type when the variant is
    built)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    instruction: str | None = None
    demos: Literal["none", "pool"] | int = "none"
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a variant needs a name (it labels the candidate in the results)")
        return value

    @field_validator("demos")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"demos={value}: a number of demos must be >= 1 (or 'none' / 'pool')")
        return value


class VariantSearch(Optimizer):
    """Score each of ``variants`` on the validation tasks, in order, while the budget lasts.

    The demo pool (when a variant takes demos) costs one run of the training tasks, by
    ``teacher`` when given."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    variants: list[Variant]
    teacher: Agent | None = None

    @model_validator(mode="after")
    def _distinct(self) -> VariantSearch:
        if not self.variants:
            raise ValueError("variants is empty: name at least one")
        names = [v.name for v in self.variants]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"variant names must differ: {repeated} repeat")
        return self

    def search(self, search: Search) -> None:
        """Bootstrap the pool once if a variant needs it, then validate each variant."""
        report: EvalReport | None = None
        if any(v.demos != "none" for v in self.variants):
            report = bootstrap_report(search, teacher=self.teacher)
        pools: dict[str, dict[str, list[Any]]] = {}
        for variant in self.variants:
            if not search.can(len(search.valset)):
                break
            params = variant_params(search.baseline.params, search.targets, variant)
            if variant.demos != "none":
                key = json.dumps(variant.options, sort_keys=True, default=str)
                if key not in pools:  # read by the variant's own node settings
                    pools[key] = pool_from_report(search, report, params, self.teacher)
                pool = pools[key]
                chosen = pool if variant.demos == "pool" else sample_demos(pool, variant.demos, search.rng)
                params = {
                    t: p.model_copy(update={"demos": list(chosen.get(t, []))}) for t, p in params.items()
                }
            search.validate(params, note=variant.name)


def variant_params(base: Params, targets: list[str], variant: Variant) -> Params:
    """``base`` with ``variant``'s instruction, options (and no demos) on every target."""
    out: Params = {}
    for target in targets:
        p = base.get(target, NodeParams())
        update: dict[str, Any] = {"demos": []}
        if variant.instruction is not None:
            update["instruction"] = variant.instruction
        if variant.options:
            update["options"] = {**(p.options or {}), **variant.options}
        out[target] = p.model_copy(update=update)
    return out
