"""Typed errors of the task layer: each says what went wrong and what to change.

Defined in `prismserve.errors` (one hierarchy, with the HTTP status of each) and named here for the
task layer's users.
"""

from prismserve.errors import (
    ContextLengthError,
    DispatchError,
    InvalidInputError,
    RecordError,
    ReplayDivergenceError,
    TaskDefinitionError,
    TaskError,
    TaskUsageError,
)

__all__ = [
    "ContextLengthError",
    "DispatchError",
    "InvalidInputError",
    "RecordError",
    "ReplayDivergenceError",
    "TaskDefinitionError",
    "TaskError",
    "TaskUsageError",
]
