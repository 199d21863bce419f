"""The task layer: tasks, the task↔executor descriptor, data handles, streams, record & replay, task
graphs (000 §5.1–5.2)."""

from prismserve.task.base import Task, TaskData, TaskInput, TaskOutput, UnitTask
from prismserve.task.data import DataHandle, Stream
from prismserve.task.descriptor import ExecutorRef, ExecutorSettings
from prismserve.task.dispatch import Dispatcher, current_dispatcher, use_dispatcher
from prismserve.task.errors import (
    ContextLengthError,
    DispatchError,
    InvalidInputError,
    RecordError,
    ReplayDivergenceError,
    TaskDefinitionError,
    TaskError,
    TaskUsageError,
)
from prismserve.task.graph import Edge, Invocation, TaskGraph
from prismserve.task.session import replayable_choice

__all__ = [
    "ContextLengthError",
    "DataHandle",
    "DispatchError",
    "Dispatcher",
    "Edge",
    "ExecutorRef",
    "ExecutorSettings",
    "InvalidInputError",
    "Invocation",
    "RecordError",
    "ReplayDivergenceError",
    "Stream",
    "Task",
    "TaskData",
    "TaskDefinitionError",
    "TaskError",
    "TaskGraph",
    "TaskInput",
    "TaskOutput",
    "TaskUsageError",
    "UnitTask",
    "current_dispatcher",
    "replayable_choice",
    "use_dispatcher",
]
