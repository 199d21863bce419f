"""Planner errors: a message that says what to fix, never a solver trace."""


class PlannerError(ValueError):
    """Base of the planner's errors."""


class SpecError(PlannerError):
    """The plan spec is malformed or inconsistent."""


class InfeasibleError(PlannerError):
    """No deployment meets the request (budget too small, no instance fits …)."""
