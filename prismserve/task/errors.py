"""Typed errors of the task layer: each says what went wrong and what to change."""


class TaskError(Exception):
    """Base class of every error the task layer raises on purpose."""


class TaskDefinitionError(TaskError, TypeError):
    """A task class is declared in a way prismserve cannot run (async invoke, overridden unit invoke …)."""


class TaskUsageError(TaskError, RuntimeError):
    """A task is used outside the way it runs (invoke called directly, no dispatcher set …)."""


class RecordError(TaskError, RuntimeError):
    """A composite's invoke touched a placeholder's value during record."""


class ReplayDivergenceError(TaskError, RuntimeError):
    """Replay took a different path through the unit tasks than record did."""


class DispatchError(TaskError, RuntimeError):
    """A unit-task invocation of a graph could not be executed."""


class InvalidInputError(TaskError, ValueError):
    """A request's content cannot be served (undecodable media, a modality the model lacks): the
    client's fault, reported as a 4xx, not as a failed executor."""
