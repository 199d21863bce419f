"""ExecutorSpec: which backend a deployment's replicas run, and with what settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prismserve.executors.base import Executor
from prismserve.executors.sim import SimExecutor, SimProfile
from prismserve.task import UnitTask


class ExecutorSpec(BaseModel):
    """How to build the executor of one deployment's replicas.

    `model`: the real engine the unit task names in `executor_ref` (encoder, vLLM, transformers …).
    `sim`: emulated service time from `profile`; output values from `values` (a function called as
    `values(task, input)`, as a LocalDispatcher executor) or synthesised from the output type.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: Literal["sim", "model"] = "sim"
    profile: SimProfile = Field(default_factory=SimProfile)
    values: Any = None
    # Ray runtime_env of the replicas (a `model` executor's own Python environment), if any.
    runtime_env: dict[str, Any] | None = None
    # How long a replica may take to start and load (`executors.loading.start_timeout_s`).
    start_timeout_s: float = Field(default=120.0, gt=0)

    def build(self, task: UnitTask[Any, Any]) -> Executor:
        """A fresh executor for `task`."""
        if self.backend == "model":
            from prismserve.executors.loading import load_executor_class

            return load_executor_class(type(task))(task)
        return SimExecutor(task, self.profile, self.values)
