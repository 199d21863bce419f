"""The profiler: an app's deployments measured on the hardware at hand, as the planner's spec (000 §4.1).

    spec = await profile(runtime, app, workload("any2any", 200))   # the app registered on `runtime`
    plan = plan_for_budget(spec, 8)                                  # prismserve.planner
    runtime_plan = deployable(plan, spec, app)                       # cells of deployment options

Request types and the deployments each touches come from recording the app (`requests.py`), times
from serving rounds of each type (`measure.py`); `cache.py` keeps profiles per app, model and
hardware.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from prismserve.app import App
from prismserve.bench import TRACES
from prismserve.bench import workloads as w
from prismserve.bench.workloads import RequestSpec
from prismserve.errors import InvalidRequestError
from prismserve.planner import Host, Plan, PlanSpec
from prismserve.profile.budgets import Budgets, budgets_document, budgets_path, measure_budgets, served
from prismserve.profile.cache import cache_key, cache_path, cached, hardware
from prismserve.profile.measure import seconds_per_request
from prismserve.profile.requests import deployments_of, profile_requests, servable, shares
from prismserve.profile.shaped import profile_shaped
from prismserve.profile.spec import build_spec, option_layout, spec_document

log = logging.getLogger(__name__)


def check_workload(name: str) -> None:
    """Raise WorkloadError unless `name` is a workload's name or an existing workload file."""
    if name not in TRACES and not Path(name).is_file():
        raise w.WorkloadError(
            f"unknown workload {name!r}: give a workload file or one of {', '.join(TRACES)}"
        )


def workload(name: str, count: int, seed: int = 0) -> list[RequestSpec]:
    """`count` requests of a named workload (`prismserve bench --workload`'s names), or the requests of
    a workload file (JSON lines, `bench.workloads.read_requests`); arrival times unused."""
    check_workload(name)
    if name not in TRACES:
        return w.read_requests(name)
    return w.trace(name, w.Arrivals("poisson", 1.0), count=count, seed=seed)


async def profile(
    runtime: Any,
    app: App,
    specs: list[RequestSpec],
    batch: int = 4,
    rounds: int = 2,
    shared_cpu: bool | None = None,
) -> PlanSpec:
    """The planner's spec of `app` (registered on `runtime`) for the mix of `specs`: one solo option
    per deployment and the colocations the app packs on one GPU, their per-type times measured in
    rounds of `batch` requests of a type at a time, each asking for the type's mean output tokens
    (`requests.profile_requests`). With `shared_cpu` (default: when the replicas run on this
    machine's CPU, as on declared GPUs) the machine's CPU time per request is measured too: every
    replica shares those CPUs, which caps the planned rate (`PlanSpec.host`).

    An app that gives its spec's shape (`Config.planner_spec`: emulated models, whose options are
    alternatives for the same components) is measured on that shape (`shaped.py`); its `sim`
    replicas stand for GPUs elsewhere, so no CPU cap is measured for it."""
    kept = servable(app, specs)
    if app.config.planner_spec is not None:
        return await profile_shaped(runtime, app, kept, batch, rounds)
    examples = profile_requests(kept, w.workloads_dir(), batch)
    uses = {t: await deployments_of(app, requests[0]) for t, requests in examples.items()}
    paths = {task.deployment_key(): path for path, task in app.named_unit_tasks().items()}
    measured, cpu = await seconds_per_request(runtime, app, examples, batch, rounds)
    if not measured:
        raise InvalidRequestError(
            f"app {app.name!r} refused every request of the profile's workload (see the log): give a "
            "workload its model takes (--profile-workload)"
        )
    kept = [s for s in kept if s.request_type in measured]  # a refused type is not planned for
    uses = {t: used for t, used in uses.items() if t in measured}
    seconds = {t: {paths[k]: s for k, s in row.items() if k in paths} for t, row in measured.items()}
    spec = build_spec(app, shares(kept), uses, seconds)
    if shared_cpu if shared_cpu is not None else runs_on_this_cpu(runtime):
        import psutil

        host = Host(cpus=psutil.cpu_count() or 1, seconds={t: max(s, 1e-6) for t, s in cpu.items()})
        spec = spec.model_copy(update={"host": host})
    return spec


def runs_on_this_cpu(runtime: Any) -> bool:
    """Whether the replicas all run on this machine's CPU: GPUs declared on a local Ray, or the CPU
    chosen as the device (`PRISMSERVE_DEVICE=cpu`) without joining a cluster."""
    local = getattr(runtime, "address", None) is None
    return local and (
        getattr(runtime, "fake_gpus", None) is not None or os.environ.get("PRISMSERVE_DEVICE") == "cpu"
    )


async def cached_profile(
    runtime: Any,
    app: App,
    source: str,
    workload_name: str = "any2any",
    requests: int = 200,
    batch: int = 4,
    rounds: int = 2,
    refresh: bool = False,
) -> tuple[PlanSpec, Path, bool]:
    """`app`'s profile on this runtime's hardware: read from the cache, else measured and cached.

    Returns the spec, its file, and whether it was measured now."""
    about = {
        "app": app.name,
        "hardware": hardware(runtime),
        "workload": _workload_identity(workload_name, requests),
        "batch": batch,
        "rounds": rounds,
        "requests": "asking for the type's mean output tokens",  # not each its own: profiles differ
    }
    if app.config.planner_spec is not None:  # emulated: its sim replicas run at this speed
        about["sim speedup"] = os.environ.get("PRISMSERVE_SIM_SPEEDUP", "1")
    path = cache_path(app, cache_key(app, source, about))
    spec = None if refresh else cached(path)
    if spec is not None:
        return spec, path, False
    spec = await profile(runtime, app, workload(workload_name, requests), batch, rounds)
    path.parent.mkdir(parents=True, exist_ok=True)
    budgets = await app_budgets(runtime, app)
    if budgets is not None:  # first: a spec in the cache has its budgets beside it
        _write(budgets_path(path), budgets_document(budgets, {"budgets of": app.name, **about}))
    _write(path, spec_document(spec, {"profile of": app.name, **about}))
    return spec, path, True


def _write(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)  # a reader never sees half a file


async def app_budgets(runtime: Any, app: App) -> Budgets | None:
    """The stage-level batching budgets of `app`'s deployments (`budgets.py`), measured on `runtime`'s
    replicas; None when its SLOs bound none (no TTFT or TBT, or no deployment with a budget to set),
    or the app gives its spec's shape (emulated: its `sim` replicas have no batch to set)."""
    if app.config.planner_spec is not None:
        return None
    budgets = await measure_budgets(
        await served(runtime, app), app, (w.workloads_dir() / "media" / "cars.jpg").read_bytes()
    )
    return budgets if budgets.deployments else None


def _workload_identity(name: str, requests: int) -> str:
    """What names a workload in the cache key: its name and size, or a workload file's name and
    content (not its folder: the same file written elsewhere, a temporary copy, is the same workload)."""
    if name in TRACES or not Path(name).is_file():
        return f"{name} ({requests} requests)"
    return f"{Path(name).name} (sha256 {hashlib.sha256(Path(name).read_bytes()).hexdigest()[:16]})"


async def plan_at_start(
    runtime: Any, app: App, source: str, gpus: int | None, workload_name: str = "any2any"
) -> tuple[PlanSpec, Plan, int]:
    """Profile `app` (cached), plan the most throughput for `gpus` GPUs (None: every GPU of the
    cluster) and deploy the plan; returns the profile, the plan and the budget planned for."""
    from prismserve.planner import plan_for_budget

    spec, path, fresh = await cached_profile(runtime, app, source, workload_name)
    log.info("%s profile of %s: %s", "measured" if fresh else "cached", app.name, path)
    budget = gpus if gpus is not None else int(sum(runtime.resources.inventory().values()))
    plan = plan_for_budget(spec, budget)
    await runtime.deploy(app.name, deployable(plan, spec, app))
    print(
        f"prismserve: planned {app.name!r} for {budget} GPUs: {plan.throughput:.3g} req/s predicted "
        f"({', '.join(f'{n} x{r}' for n, r in plan.replicas().items() if r)}); profile {path}",
        flush=True,
    )
    return spec, plan, budget


def deployable(plan: Plan, spec: PlanSpec, app: App) -> Plan:
    """The planner's plan for `spec` as the runtime deploys it on `app`: its options laid out (or
    as the app's own `deployment_plan` says, for an app that gives its spec's shape)."""
    if app.config.deployment_plan is not None:
        return Plan.model_validate(app.config.deployment_plan(plan))
    return plan.model_copy(update={"options": option_layout(spec, app)})


__all__ = [
    "check_workload",
    "cached_profile",
    "plan_at_start",
    "deployable",
    "option_layout",
    "profile",
    "workload",
]
