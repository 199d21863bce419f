"""RayRuntime: apps served on executor replicas placed on a Ray cluster's GPUs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from prismserve.app import App
from prismserve.executors import envs
from prismserve.executors.loading import start_timeout_s
from prismserve.executors.sim import SimProfile
from prismserve.executors.spec import ExecutorSpec
from prismserve.offline import DEVICE_VARIABLE
from prismserve.planner import CellPlan, Plan
from prismserve.runtime.base import Runtime
from prismserve.runtime.cluster import connect, local_ray_down
from prismserve.runtime.dispatcher import ReplicaDispatcher
from prismserve.runtime.layout import Layout, layout, variant
from prismserve.runtime.nodes import check_nodes, needs_of
from prismserve.runtime.pool import RayActorPool, ReplicaPool, WirePool
from prismserve.runtime.resources import ResourceManager, first_fit_decreasing
from prismserve.runtime.task_manager import TaskManager
from prismserve.task import Dispatcher, UnitTask
from prismserve.task.routing import PathLoad, RoutingPolicy

log = logging.getLogger(__name__)

DEFAULT_SLAB_BYTES = 64 << 20


def default_cells(shapes: dict[str, float]) -> list[CellPlan]:
    """The cells of one replica per deployment (`shapes`: GPUs per replica by deployment key) that a
    new app gets before any plan: a cell each for deployments of whole GPUs or none, and the
    deployments with a share of a GPU packed first-fit-decreasing into cells of one GPU (so a split
    model whose small components share a GPU with an LLM stage fits on that many GPUs)."""
    cells = [CellPlan(gpus=int(g), replicas={key: 1}) for key, g in shapes.items() if g == 0 or g >= 1]
    shared = first_fit_decreasing([(key, g) for key, g in shapes.items() if 0 < g < 1])
    return cells + [CellPlan(gpus=1, replicas=dict.fromkeys(keys, 1)) for keys in shared]


class RayRuntime(Runtime):
    """Task managers per deployment, cells on the cluster, and a dispatcher over their replicas.

    Unit tasks that name an executor (`executor_ref`) run on it (real models); the others, and deployments a plan
    gives a `sim` profile, run on `sim` executors. `values` maps a unit-task class to the function
    that computes its `sim` outputs, beside those apps declare (`AppConfig.sim_values`); other tasks get outputs
    synthesised from their output type. `pool` runs the replicas (by default `WirePool`: Ray actors
    called over their sockets; an
    `InProcessPool` with declared GPUs runs the same control plane in this process, without Ray).
    `fake_gpus` declares GPUs (on a local Ray it starts) and runs model replicas on the CPU
    (`PRISMSERVE_DEVICE=cpu`); `replica_env` sets more environment variables of model replicas.
    A new plan's dropped cells are drained before they are removed, while requests on them keep
    finishing: at most `drain_timeout_s` without one finishing.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        fake_gpus: int | None = None,
        policy: RoutingPolicy = "static",
        values: Mapping[type, Callable[..., Any]] | None = None,
        default_profile: SimProfile | None = None,
        slab_bytes: int = DEFAULT_SLAB_BYTES,
        health_interval_s: float = 2.0,
        restart_wait_s: float = 60.0,
        pool: ReplicaPool | None = None,
        replica_env: Mapping[str, str] | None = None,
        drain_timeout_s: float = 120.0,
    ) -> None:
        super().__init__()
        self.pool = pool or WirePool()
        self.address = address
        self.fake_gpus = fake_gpus
        # Environment variables of the model replicas, over the cluster's: declared GPUs run them on the CPU.
        self.replica_env = {
            **({DEVICE_VARIABLE: "cpu"} if fake_gpus is not None else {}),
            **(replica_env or {}),
        }
        self.values = dict(values or {})
        self.default_profile = default_profile or SimProfile()
        self.slab_bytes = slab_bytes
        self.health_interval_s = health_interval_s
        self.restart_wait_s = restart_wait_s
        self.managers: dict[str, TaskManager] = {}
        self.resources = ResourceManager(pool=self.pool, drain_timeout_s=drain_timeout_s)
        self._dispatcher = ReplicaDispatcher(self.managers, policy)
        self._health: asyncio.Task[None] | None = None

    @property
    def dispatcher(self) -> Dispatcher:
        return self._dispatcher

    @property
    def policy(self) -> RoutingPolicy:
        """How replicas are picked: `static` (planned, no queries) or `dynamic` (least loaded, queried)."""
        return self._dispatcher.policy

    @policy.setter
    def policy(self, value: RoutingPolicy) -> None:
        self._dispatcher.policy = value

    def path_load(self) -> PathLoad | None:
        """With `path` routing, the dispatcher's count of each deployment's load (no queries)."""
        return self._dispatcher.load if self.policy == "path" else None

    async def start(self) -> None:
        if isinstance(self.pool, RayActorPool):
            connect(self.address, fake_gpus=self.fake_gpus)
        if self._health is None:
            self._health = asyncio.get_running_loop().create_task(self._check_health())

    async def close(self) -> None:
        if self._health is not None:
            # Cancelled until it ends: Python 3.11's `asyncio.wait_for` (a health check's) swallows a
            # cancellation that comes as the call it waits for returns, and the checks would go on.
            while not self._health.done():
                self._health.cancel()
                await asyncio.wait([self._health], timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                self._health.result()
            self._health = None
        await self.resources.close()
        for manager in self.managers.values():
            await manager.close()
        self.managers.clear()

    def queue_depths(self) -> dict[str, int]:
        return {key: manager.queue_depth() for key, manager in self.managers.items()}

    def stages(self) -> dict[str, TaskManager]:
        return dict(self.managers)

    @property
    def places_cells(self) -> bool:
        return True

    def app_cells(self, app_name: str) -> list[CellPlan]:
        return [
            CellPlan(gpus=cell.gpus, replicas=dict(cell.replicas), node=cell.node)
            for cell in self.resources.cells
            if cell.owner == app_name
        ]

    def gpu_count(self) -> int:
        return int(sum(self.resources.inventory().values()))

    def tokens_leased(self, key: str) -> int:
        manager = self.managers.get(key)
        return manager.tokens if manager is not None else 0

    def full_batch_rate(self, key: str) -> float | None:
        manager = self.managers.get(key)
        spec = manager.spec if manager is not None else None
        return spec.profile.full_batch_rate() if spec is not None and spec.backend == "sim" else None

    async def _on_register(self, app: App) -> None:
        if isinstance(self.pool, RayActorPool):
            from ray import cloudpickle  # the pickler Ray serialises with

            # App files are not importable in Ray workers: their classes travel by value.
            cloudpickle.register_pickle_by_value(app.module)
        self.values.update(app.config.sim_values)
        tasks = {task.deployment_key(): task for task in app.named_unit_tasks().values()}
        # Every spec first: one that cannot be built (an executor environment missing) leaves nothing behind.
        specs = {key: self._spec(task, None) for key, task in tasks.items() if key not in self.managers}
        real = [key for key, spec in specs.items() if spec.backend == "model"]
        if real and isinstance(self.pool, RayActorPool):  # every node can start them, or it is said now
            models = [getattr(tasks[key], "model", "") for key in real]
            await check_nodes(needs_of([m for m in models if m], [specs[key].runtime_env for key in real]))
        missing = {}
        for key, task in tasks.items():
            if key in specs:
                self.managers[key] = TaskManager(
                    key, task, specs[key], self.slab_bytes, pool=self.pool, restart_wait_s=self.restart_wait_s
                )
            if not self.managers[key].replicas:
                missing[key] = task
        self._route_replicas(app)
        # Cells of one replica per deployment that has none yet; a plan replaces them.
        cells = default_cells({key: task.gpus for key, task in missing.items()})
        short = self.resources.shortage(app.name, cells)
        placed = (
            [short]
            if short
            else await asyncio.gather(
                *(
                    self.resources.create_cell(app.name, cell.gpus, cell.replicas, self.managers)
                    for cell in cells
                ),
                return_exceptions=True,
            )
        )
        errors = [e for e in placed if isinstance(e, BaseException)]
        if errors:  # a replica that cannot start fails the registration, and nothing of it stays up
            for cell in [c for c in self.resources.cells if c.owner == app.name]:
                await self.resources.remove_cell(cell)
            for key in specs:
                await self.managers.pop(key).close()
            raise errors[0]

    async def _on_unregister(self, name: str, released_keys: list[str]) -> None:
        users = {key: d.apps for key, d in self.registry.deployments.items()}
        for cell in [c for c in self.resources.cells if c.owner == name]:
            still_used = [users[k] for k in cell.replicas if k in users]
            if still_used:
                cell.owner = sorted(still_used[0])[0]  # a deployment another app uses stays up
            else:
                await self.resources.remove_cell(cell)
        for key in released_keys:
            manager = self.managers.pop(key, None)
            if manager is not None:
                await manager.close()

    async def _on_deploy(self, app: App, plan: Plan) -> None:
        names = app.named_unit_tasks()
        placed = layout(names, plan) if plan.options else None
        if placed is not None:
            self._add_variants(app, placed)
            self._route_replicas(app)
        respecced = []
        for name, profile in plan.profiles.items():
            # A deployment's profile holds for its variants at other GPU shapes too.
            for manager in self._variants_of(names[name]):
                manager.spec = self._spec(manager.task, SimProfile.model_validate(profile))
                respecced.append(manager)
        desired = (
            placed.cells
            if placed is not None
            else [
                CellPlan(
                    gpus=cell.gpus,
                    count=cell.count,
                    replicas={names[n].deployment_key(): r for n, r in cell.replicas.items() if r},
                    node=cell.node,
                )
                for cell in plan.cells
            ]
        )

        def switch() -> None:  # new requests follow the new plan once its cells are up, before old ones drain
            self.plans[app.name] = plan
            if placed is not None:
                self.layouts[app.name] = placed
            else:
                self.layouts.pop(app.name, None)

        added, removed = await self.resources.apply(app.name, desired, self.managers, switch)
        # Cells kept from before run replicas with the old profile: replace those.
        await asyncio.gather(*(manager.respec(manager.spec) for manager in respecced))
        log.info("plan for %s applied: %d cells added, %d removed", app.name, added, removed)

    def _add_variants(self, app: App, placed: Layout) -> None:
        """Task managers for the deployments a plan's deployment options add (another GPU shape)."""
        for key, task in placed.tasks.items():
            self.registry.share(app.name, task)
            if key not in self.managers:
                self.managers[key] = TaskManager(
                    key,
                    task,
                    self._spec(task, None),
                    self.slab_bytes,
                    pool=self.pool,
                    restart_wait_s=self.restart_wait_s,
                )

    def _route_replicas(self, app: App) -> None:
        """Give the app's deployments (and their variants at other GPU shapes) the replica routing
        its config names (`AppConfig.replica_routing`)."""
        names = app.named_unit_tasks()
        for name, policy in app.config.replica_routing.items():
            for manager in self._variants_of(names[name]):
                manager.policy = policy  # type: ignore[assignment]  # checked when the app loaded

    def _variants_of(self, task: UnitTask[Any, Any]) -> list[TaskManager]:
        """The managers of `task`'s deployment and of its variants at other GPU shapes."""
        key = task.deployment_key()
        return [
            m
            for m in self.managers.values()
            if type(m.task) is type(task) and variant(m.task, task.gpus).deployment_key() == key
        ]

    def _spec(self, task: UnitTask[Any, Any], profile: SimProfile | None) -> ExecutorSpec:
        # A plan's profile asks for emulation; otherwise a task that names its engine runs on it.
        ref = type(task).executor_ref
        if profile is None and ref is not None:
            return ExecutorSpec(
                backend="model",
                runtime_env=self._model_runtime_env(ref.env),
                start_timeout_s=start_timeout_s(task),
            )
        return ExecutorSpec(
            profile=profile or self.default_profile,
            values=self.values.get(type(task)),
            start_timeout_s=start_timeout_s(None),
        )

    def _model_runtime_env(self, env: str | None) -> dict[str, Any] | None:
        """The Ray runtime_env of a model replica: its executor environment's, with `replica_env`."""
        runtime_env: dict[str, Any] = envs.runtime_env(env) if env else {}
        if self.replica_env:
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **self.replica_env}
        return runtime_env or None

    def _deployment_status(self, key: str) -> dict[str, Any]:
        manager = self.managers.get(key)
        if manager is None:
            return {"replicas": []}
        emulated = {"executor_kind": "sim"} if manager.spec.backend == "sim" else {}  # a plan's `emulate`
        return {
            **emulated,
            "replicas": [
                {
                    "id": r.id,
                    "state": r.state.value,
                    "in_flight": r.in_flight,
                    "restarts": r.restarts,
                    "gpus": r.placement.gpus,
                    "cell": r.placement.cell_id,
                    **r.info,
                }
                for r in manager.replicas
            ],
        }

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["policy"] = self.policy
        status["gpus"] = {
            "total": sum(self.resources.inventory().values()),
            "free": sum(self.resources.free_gpus().values()),
        }
        status["cells"] = [
            {
                "id": c.id,
                "owner": c.owner,
                "gpus": c.gpus,
                "node_id": c.node_id,
                "node": c.node,
                "replicas": c.replicas,
            }
            for c in self.resources.cells
        ]
        if local_ray_down():
            status["ray"] = "the local Ray lost its GCS or raylet: restart the server"
        return status

    async def _check_health(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            if local_ray_down():
                # Its GCS or raylet died (a crash, or Ctrl-C to the process group): asking it for its
                # nodes would hold the event loop until Ray gives up on its GCS (60 s) and ends the
                # process. Nothing can be re-placed without it.
                log.error(
                    "the local Ray lost its GCS or raylet: replicas are no longer checked; restart the server"
                )
                return
            try:
                await self.resources.replace_lost(self.managers)
            except Exception:  # noqa: BLE001 - the replicas' own checks go on
                log.exception("re-placing the cells of lost nodes failed")
            for manager in list(self.managers.values()):
                try:
                    await manager.check_health(timeout_s=max(1.0, self.health_interval_s))
                except Exception:  # noqa: BLE001 - keep checking the others
                    log.exception("health check of %s failed", manager.name)
