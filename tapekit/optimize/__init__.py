"""Prompt optimisation over tapes: one :func:`optimize` entry for every optimiser.

Tapes are the traces: optimisers read the node runs on scored training tapes (demos from good
ones, feedback on bad ones) and :func:`tapekit.evaluate.evaluate` is the judge. An optimiser
changes only the ``instruction``, ``demos`` and named options of the targeted nodes, so the optimised agent is
the same agent class, saved as a small JSON config (:meth:`OptimizeResult.save`,
:func:`load_optimized`), and resumes from any tape like the original. See docs/optimize.md.
"""

from tapekit.optimize._optimize import OptimizeResult, OptimizerRun, optimize
from tapekit.optimize._run import BudgetExhausted, Candidate, candidate_tag
from tapekit.optimize._targets import (
    NodeParams,
    OptimizeError,
    load_optimized,
    optimisable_nodes,
    save_optimized,
    with_params,
)
from tapekit.optimize.base import Optimizer
from tapekit.optimize.demos import AddDemos, BootstrapFewShot
from tapekit.optimize.instructions import InstructionSearch
from tapekit.optimize.reflective import Reflective, pareto_front
from tapekit.optimize.variants import Variant, VariantSearch

__all__ = [
    "AddDemos",
    "BootstrapFewShot",
    "BudgetExhausted",
    "Candidate",
    "InstructionSearch",
    "NodeParams",
    "OptimizeError",
    "OptimizeResult",
    "Optimizer",
    "OptimizerRun",
    "Reflective",
    "Variant",
    "VariantSearch",
    "candidate_tag",
    "load_optimized",
    "optimisable_nodes",
    "optimize",
    "pareto_front",
    "save_optimized",
    "with_params",
]
