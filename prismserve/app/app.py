"""A loaded app: its tasks, the typed serve() entry point, and how to call it."""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from prismserve.app.config import SLO, AppConfig, Autoscale
from prismserve.task import Task, UnitTask


@dataclass(frozen=True, eq=False)
class App:
    """An app module that passed validation: name, tasks, serve() and its request/response types."""

    name: str
    module: ModuleType
    config: type[AppConfig]
    tasks: dict[str, Task[Any, Any]]
    serve_fn: Callable[[Any], Any]
    request_model: type[BaseModel]  # what serve() takes (its requests' type labels are `request_type`s)
    response_model: type[BaseModel]  # the chunk model when `streaming`
    streaming: bool
    created: float = field(default_factory=time.time)  # when it was loaded (GET /v1/models)

    @cached_property
    def slos(self) -> dict[str, SLO]:
        """The app's SLOs by request type (`Config.slos`, validated)."""
        return {kind: SLO.model_validate(slo) for kind, slo in dict(self.config.slos).items()}

    @cached_property
    def autoscale(self) -> Autoscale | None:
        """The app's autoscaling settings (`Config.autoscale`, validated), or None."""
        value = self.config.autoscale
        return None if value is None else Autoscale.model_validate(value)

    @cached_property
    def context_length(self) -> int | None:
        """The most tokens a request's prompt and reply hold together: `Config.context_length`, else
        the smallest context the app's LLM tasks state, else None (unknown: the engine checks)."""
        if self.config.context_length is not None:
            return self.config.context_length
        lengths = [
            length
            for unit in self.unit_tasks().values()
            if callable(stated := getattr(unit, "context_length", None)) and (length := stated()) is not None
        ]
        return min(lengths, default=None)

    def slo(self, request_type: str) -> SLO | None:
        """The SLO of requests of `request_type`: its own, else the app's `default`, else None."""
        slos = self.slos
        return slos.get(request_type, slos.get("default"))

    def named_unit_tasks(self) -> dict[str, UnitTask[Any, Any]]:
        """The app's unit tasks by path (`omni.thinker.llm`), one per deployment key.

        Plans name deployments by these paths.
        """
        found: dict[str, UnitTask[Any, Any]] = {}
        keys: set[str] = set()
        for name, task in self.tasks.items():
            for path, unit in task.named_unit_tasks(name).items():
                if unit.deployment_key() not in keys:
                    keys.add(unit.deployment_key())
                    found[path] = unit
        return found

    def unit_tasks(self) -> dict[str, UnitTask[Any, Any]]:
        """The app's unit tasks, one per deployment key (equivalent tasks collapse into one)."""
        return {unit.deployment_key(): unit for unit in self.named_unit_tasks().values()}

    def parse_request(self, data: Any) -> BaseModel:
        """The request as the app's request type; raises pydantic's ValidationError on bad input."""
        if isinstance(data, self.request_model):
            return data
        if isinstance(data, (str, bytes)):
            return self.request_model.model_validate_json(data)
        return self.request_model.model_validate(data)

    async def serve(self, request: Any) -> BaseModel | AsyncIterator[BaseModel]:
        """Run serve() on a request: a response model, or an async iterator of chunks when streaming.

        Task calls inside serve() run on the dispatcher set with `use_dispatcher`.
        """
        request = self.parse_request(request)
        if self.streaming:
            result = self.serve_fn(request)
            if inspect.isawaitable(result):
                result = await result
            return result
        return await self.serve_fn(request)
