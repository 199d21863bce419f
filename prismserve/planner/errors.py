"""Errors of the planner: defined in `prismserve.errors` (one hierarchy), named here for its users."""

from prismserve.errors import InfeasibleError, PlannerError, SpecError

__all__ = ["InfeasibleError", "PlannerError", "SpecError"]
