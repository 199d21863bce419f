"""The typed contract between a unit task and the executor that runs it for real.

A unit task class names its executor with an `ExecutorRef` (an import path, resolved on first use),
so that the task layer never imports an engine and the executors never import the task library:
both meet here and in `prismserve.task.components`, where the inputs, outputs and settings of the
built-in components live. An executor is generic over the settings it reads from its task and the
input and output types it serves (`prismserve.executors.base.Executor`); a test checks every unit
task's executor against its task's types.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel

from prismserve.task.errors import TaskDefinitionError


class ExecutorSettings(BaseModel):
    """What every executor may read of the unit task it runs: the GPUs of a replica. Unit tasks are
    ExecutorSettings, and so are the settings of each built-in component (`task.components`)."""

    # GPUs per replica: 0 (no GPU), a share < 1 of one GPU (several deployments' replicas share it),
    # or a whole number (a vLLM stage's tensor parallelism). A unit task fills it from its class's
    # `default_gpus` when absent; the 1.0 here only serves `model_construct`, which skips validation.
    gpus: float = 1.0


@dataclass(frozen=True)
class ExecutorRef:
    """The Executor class that runs a unit task for real, as `module:Class`, imported on first use (an
    engine's module may import torch); `env` names the Python environment its replicas run in
    (`prismserve.executors.envs`; None: the serving process's own)."""

    path: str
    env: str | None = None

    def __post_init__(self) -> None:
        module, _, name = self.path.partition(":")
        if not (module and name.isidentifier()):
            raise TaskDefinitionError(
                f"ExecutorRef({self.path!r}): name the executor as 'package.module:ClassName'"
            )

    def resolve(self) -> type[Any]:
        """The class the path names (imported once); TaskDefinitionError when there is none."""
        return self._resolved

    @cached_property
    def _resolved(self) -> type[Any]:
        module_name, _, name = self.path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TaskDefinitionError(
                f"executor {self.path!r} cannot be imported ({exc}): correct the module path, or install "
                "its engine in this environment"
            ) from exc
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            raise TaskDefinitionError(f"executor {self.path!r}: {module_name} defines no class {name}")
        return cls
