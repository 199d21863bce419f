"""The runtime interface the gateway serves through, and LocalRuntime, its in-process form."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from pydantic import ValidationError

from prismserve.app import App, AppLoadError, AppRegistry, load_app_source
from prismserve.errors import InvalidRequestError
from prismserve.executors.sim import SimProfile
from prismserve.planner import CellPlan, Plan
from prismserve.runtime.layout import Layout, check_layout
from prismserve.runtime.local import LocalDispatcher, LocalExecutor
from prismserve.runtime.task_manager import TaskManager, current_era
from prismserve.task import Dispatcher, UnitTask, use_dispatcher
from prismserve.task.context import RequestContext, RequestLedger, use_request
from prismserve.task.routing import PathLoad, Routing


class Runtime(ABC):
    """Apps, their deployments, and the dispatcher that task calls in serve() run on.

    The gateway calls `app.serve(request)` inside `runtime.request(...)`.
    """

    def __init__(self) -> None:
        self.registry = AppRegistry()
        self.plans: dict[str, Plan] = {}
        # Per app, its plan's deployment options as deployed (runtimes that place cells set it).
        self.layouts: dict[str, Layout] = {}
        # Per app, its names of its tasks by id: what divergence errors name a request's root by.
        self._task_names: dict[str, dict[int, str]] = {}

    @property
    @abstractmethod
    def dispatcher(self) -> Dispatcher:
        """Where the unit-task invocations of every request are executed."""

    async def start(self) -> None:  # noqa: B027 - a hook: doing nothing is right for some runtimes
        """Bring up whatever the runtime needs (cluster connection, actors)."""

    async def close(self) -> None:  # noqa: B027 - a hook: doing nothing is right for some runtimes
        """Stop every executor the runtime started."""

    @contextlib.asynccontextmanager
    async def request(
        self,
        app_name: str | None = None,
        request_type: str | None = None,
        request_id: str = "",
        routing: Routing | None = None,
    ) -> AsyncIterator[RequestContext]:
        """Serve one request of `app_name` inside the block (until its response is fully sent): its
        task calls run on this runtime's dispatcher, its routers follow the plan deployed for that
        app, its calls go along a path of `request_type` picked by the plan when the plan names
        deployment options, carrying the deadline of the type's SLO, errors name unit tasks by their
        paths in the app, and what its task graphs left behind (payloads, streams) is released when
        the block ends. Yields the request's context (its start, and the tokens its calls counted:
        what its SLO is judged by). `routing` replaces the plan's path probabilities for this
        request alone: the profiler sends a round along one path to time each hop of it."""
        context = self._context(app_name, request_type, request_id)
        if routing is not None:
            context = dataclasses.replace(context, routing=routing)
        with use_request(context) as context:
            try:
                with use_dispatcher(self.dispatcher):
                    yield context
            finally:
                assert context.ledger is not None  # made with one
                context.ledger.end()

    def path_load(self) -> PathLoad | None:
        """Each deployment's load as path-level routing reads it (None: paths follow the plan's split;
        runtimes serving `--routing path` give theirs)."""
        return None

    def _context(self, app_name: str | None, request_type: str | None, request_id: str) -> RequestContext:
        """The context of a request of `request_type` to `app_name` arriving now."""
        app = self.registry.find(app_name) if app_name is not None else None
        slo = app.slo(request_type or "default") if app is not None else None
        plan = self.plans.get(app_name) if app_name is not None else None
        placed = self.layouts.get(app_name) if app_name is not None else None
        load = self.path_load()
        return RequestContext(
            id=request_id,
            app=app_name,
            request_type=request_type,
            start=time.time(),
            due_s=slo.first_due_s if slo is not None else None,
            era=current_era(),
            routing=plan.routing if plan is not None else None,
            targets=placed.targets(request_type, load) if placed is not None else None,
            load=load,
            task_names=self._task_names.get(app_name) if app_name is not None else None,
            ledger=RequestLedger(),
        )

    async def register_app(
        self,
        source: str,
        name: str,
        filename: str | None = None,
        prepare: Callable[[App], None] | None = None,
    ) -> App:
        """Load, validate and register an app from its source; deploy what it needs. `prepare` changes
        the loaded app before its deployments are keyed and started (the profile's batching budgets).

        Raises AppLoadError or AppRegistryError with a message for the user.
        """
        app = load_app_source(source, name, filename or f"<app {name}>")
        if prepare is not None:
            prepare(app)
        self.registry.register(app)
        try:
            await self._on_register(app)
        except BaseException:
            self.registry.unregister(app.name)
            raise
        self._task_names[app.name] = {id(task): name for name, task in app.tasks.items()}
        return app

    async def unregister_app(self, name: str) -> None:
        """Unregister an app and stop the deployments no other app uses."""
        released = self.registry.unregister(name)
        self.plans.pop(name, None)
        self.layouts.pop(name, None)
        self._task_names.pop(name, None)
        await self._on_unregister(name, [d.key for d in released])

    async def deploy(self, app_name: str, plan: Plan) -> None:
        """Apply a plan to an app's deployments (only what differs changes)."""
        app = self.registry.get(app_name)
        names = app.named_unit_tasks()
        check_layout(plan)
        deployments = {d for o in plan.options.values() for d in o} if plan.options else plan.replicas()
        unknown = sorted((set(deployments) | set(plan.profiles) | set(plan.emulate)) - set(names))
        if unknown:
            raise InvalidRequestError(
                f"plan names deployments {unknown} that app {app_name!r} does not have; it has {sorted(names)}"
            )
        pinned = sorted({cell.node for cell in plan.cells if cell.node is not None})
        if pinned and not self.places_cells:
            raise InvalidRequestError(
                f"plan pins cells to nodes {pinned} (a topology-aware plan), and this runtime places no "
                "cells: serve it on Ray (without --in-process), or drop `node` from the plan's cells"
            )
        if not plan.options:  # paths of deployment options are routed by the runtime, not the app's routers
            _check_routing(app, plan.routing)
        for name, profile in plan.profiles.items():
            try:
                SimProfile.model_validate(profile)
            except ValidationError as exc:
                errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise InvalidRequestError(f"plan profiles[{name!r}] is not a sim profile: {errors}") from None
        _check_emulation(names, plan)
        await self._on_deploy(app, plan)
        self.plans[app_name] = plan

    def status(self) -> dict[str, Any]:
        """Apps, deployments and their replicas, as JSON-compatible data."""
        return {
            "apps": {
                name: {
                    "deployments": {path: t.deployment_key() for path, t in app.named_unit_tasks().items()}
                }
                for name, app in self.registry.apps.items()
            },
            "deployments": {
                key: {
                    "executor_kind": d.task.executor_kind,
                    "apps": sorted(d.apps),
                    **self._deployment_status(key),
                }
                for key, d in self.registry.deployments.items()
            },
        }

    def queue_depths(self) -> dict[str, int]:
        """Invocations queued or running per deployment key."""
        return {}

    def stages(self) -> dict[str, TaskManager]:
        """The task managers of the deployments, by key (their `stats`, for the gateway's metrics)."""
        return {}

    # What the control loops read (`prismserve.control.RuntimeControl`); a runtime that places no
    # cells has nothing for them to scale.

    @property
    def places_cells(self) -> bool:
        """Whether this runtime places cells on a cluster's GPUs."""
        return False

    def app_cells(self, app_name: str) -> list[CellPlan]:
        """The cells the app's deployments run on now, their replicas by deployment key."""
        return []

    def gpu_count(self) -> int:
        """The GPUs this runtime may place cells on."""
        return 0

    def tokens_leased(self, key: str) -> int:
        """Tokens the calls of deployment `key` have carried since it started (0: no such deployment)."""
        return 0

    def full_batch_rate(self, key: str) -> float | None:
        """Tokens/s one replica of deployment `key` serves at full batch, where its executor knows it."""
        return None

    async def _on_register(self, app: App) -> None:  # noqa: B027 - a hook: doing nothing is right for some runtimes
        """Start the deployments a newly registered app needs."""

    async def _on_unregister(self, name: str, released_keys: list[str]) -> None:  # noqa: B027 - a hook: doing nothing is right for some runtimes
        """Stop deployments no app uses any more."""

    async def _on_deploy(self, app: App, plan: Plan) -> None:  # noqa: B027 - a hook: doing nothing is right for some runtimes
        """Apply a plan."""

    def _deployment_status(self, key: str) -> dict[str, Any]:
        return {}


def _check_emulation(names: dict[str, UnitTask[Any, Any]], plan: Plan) -> None:
    """A profile turns a real model's deployment into a `sim` one (service times emulated, outputs
    placeholders): only where the plan's `emulate` asks for it by name."""
    real = sorted(
        n for n in plan.profiles if type(names[n]).executor_ref is not None and n not in plan.emulate
    )
    if real:
        raise InvalidRequestError(
            f"plan profiles {real} would replace real models by sim executors (emulated times, placeholder "
            "outputs): drop their profiles, or name them in the plan's `emulate` to emulate them on purpose"
        )
    bare = sorted(set(plan.emulate) - set(plan.profiles))
    if bare:
        raise InvalidRequestError(f"plan `emulate` names {bare} without a profile in the plan's `profiles`")


def _check_routing(app: App, routing: Routing) -> None:
    """Raise InvalidRequestError if the plan's routing names a path one of the app's routers does not have."""
    stack = list(app.tasks.values())
    while stack:
        task = stack.pop()
        check = getattr(task, "check_routing", None)
        if check is not None:
            check(routing)
        stack.extend(task.subtasks())


class LocalRuntime(Runtime):
    """Everything in this process (`serve --in-process`, tests): one in-process replica per
    deployment, running the executor function given for its unit task's kind, else the real
    executor the task names; started, so its model loaded, when its app registers."""

    def __init__(self, executors: Mapping[str, LocalExecutor] | None = None) -> None:
        super().__init__()
        self._dispatcher = LocalDispatcher(executors)

    @property
    def dispatcher(self) -> Dispatcher:
        return self._dispatcher

    async def close(self) -> None:
        await self._dispatcher.close()

    def stages(self) -> dict[str, TaskManager]:
        return dict(self._dispatcher.managers)

    async def _on_register(self, app: App) -> None:
        tasks = app.unit_tasks().values()
        for task in tasks:
            reason = self._dispatcher.unrunnable(task)
            if reason is not None:
                raise AppLoadError(f"app {app.name!r}: {reason}")
        for task in tasks:  # a model that cannot load is reported now, not at the first request
            await self._dispatcher.deploy(task)

    async def _on_unregister(self, name: str, released_keys: list[str]) -> None:
        for key in released_keys:
            await self._dispatcher.undeploy(key)
