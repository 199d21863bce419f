"""Re-planning while serving (000 §5.3): the emulated InternVL3 behind the gateway, on `sim` replicas
and declared GPUs (in-process pool), deployed for 10 % image requests; the traffic shifts to 90 %
while requests keep arriving; the watcher re-plans, the runtime adds the new cells before it drains
the old one, and every request sent is answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx
from runtime_apps import started_with_gateway

from prismserve.bench.loadgen import run_load
from prismserve.bench.workloads import RequestSpec
from prismserve.control import Replanner
from prismserve.emulate import INTERNVL3
from prismserve.emulate.app import app_source
from prismserve.gateway import create_gateway
from prismserve.planner import plan_for_budget, spec_at_mix
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime

TOKEN = "replan-token"
SPEEDUP = 40  # sim times / 40: an image request takes ~0.15 s, the long one ~6 s
RATE = 10.0  # requests/s sent; the plans sustain 35 (text first) and 17 (images, on the first plan)
IMAGE = (1920, 1080)


def mix(start: float, seconds: float, images_in_ten: int) -> list[RequestSpec]:
    """Requests every 1/RATE s from `start`; `images_in_ten` of every ten with an image."""
    return [
        RequestSpec(start + i / RATE, 200, 64, images=(IMAGE,) if i % 10 < images_in_ten else ())
        for i in range(int(seconds * RATE))
    ]


def test_a_mix_shift_is_replanned_and_applied_without_losing_a_request(serve_gateway, caplog):
    text_first = mix(0.0, 2.0, 1)
    spec = INTERNVL3.planner_spec(text_first)
    plan = plan_for_budget(spec, 4, max_exponent=2)  # 4 GPUs: one prefill-decode and one monolith
    runtime = RayRuntime(pool=InProcessPool({"a": 16}))  # 11 GPUs of default cells, then 4 planned

    def deployment(planned):
        return INTERNVL3.deployment_plan(planned, SPEEDUP)

    replanner = Replanner(
        runtime,
        INTERNVL3.name,
        spec,
        gpus=4,
        max_exponent=2,
        plan=plan,
        plan_to_deployment=deployment,
        speedup=SPEEDUP,
        window_s=2.0,
        interval_s=0.2,
        min_requests=10,
        mix_threshold=0.3,
        sustain_s=1.0,
        cooldown_s=600.0,
    )
    runtime_lifespan = started_with_gateway(runtime)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with runtime_lifespan(app):
            replanner.start()
            yield
            await replanner.close()

    gateway = create_gateway(runtime, admin_token=TOKEN, lifespan=lifespan)
    events = record(runtime)
    caplog.set_level(logging.WARNING, logger="prismserve")
    with (
        serve_gateway(gateway) as url,
        httpx.Client(base_url=url, timeout=120, headers={"authorization": f"Bearer {TOKEN}"}) as admin,
    ):
        response = admin.post(
            "/admin/apps", json={"name": INTERNVL3.name, "source": app_source(INTERNVL3.name)}
        )
        assert response.status_code == 201, response.text
        first = deployment(plan).model_dump(mode="json")
        response = admin.post(f"/admin/apps/{INTERNVL3.name}/plan", json=first)
        assert response.status_code == 200, response.text
        gateway.state.gateway.controls.watch(replanner)  # after: a plan posted takes over from a watcher
        (old_cell,) = [c["id"] for c in admin.get("/admin/status").json()["cells"]]
        events.clear()

        # 2 s at the planned mix, then 4 s at 90 % images, and one long image request (~6 s) sent
        # at the shift, still on the first plan's monolith when its cell is drained (~2 s later).
        long = RequestSpec(2.0, 200, 12000, images=(IMAGE,))
        specs = [*text_first, long, *mix(2.0, 4.0, 9)]
        results = asyncio.run(run_load(url, INTERNVL3.name, specs, progress=False))
        # The watcher counts the re-plan once the old cell is gone, just after the long request.
        deadline = time.monotonic() + 30
        while replanner.replans == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        metrics = admin.get("/metrics").text
        happened = list(events)  # before the gateway stops (and removes every cell)

    failed = [(r.request_type, r.status, r.error) for r in results if not r.ok]
    assert len(results) == len(specs) and not failed  # every request sent got its answer: none lost
    # ... and none had to be run again because a replica was stopped under it (the retry policy
    # would hide that from the client).
    assert "retrying" not in caplog.text and "did not drain" not in caplog.text
    assert replanner.replans == 1, f"re-plans: {list(replanner.history)}"
    (event,) = replanner.history
    assert "mix drifted" in event.reason and event.shares["image+text"] > 0.6
    # The plan deployed is the planner's for the mix observed, and it differs from the first.
    planned = plan_for_budget(spec_at_mix(spec, event.shares), 4, max_exponent=2)
    assert event.plan == planned and planned.replicas() != plan.replicas()
    assert runtime.plans[INTERNVL3.name] == deployment(planned)
    # New cells first, routing switched, then the old cell drained (the long request on it) and removed.
    added = sum(c.count for c in planned.cells)
    assert [kind for kind, *_ in happened] == ["add"] * added + ["drain", "remove"]
    drained = [(cell, busy, routed) for kind, cell, busy, routed in happened if kind == "drain"]
    assert [cell for cell, _, _ in drained] == [old_cell]
    assert drained[0][1] > 0 and drained[0][2] == deployment(planned)
    assert f'prismserve_replans{{app="{INTERNVL3.name}"}} 1.0' in metrics


def record(runtime: RayRuntime) -> list[tuple[str, int, int, object]]:
    """(add | drain | remove, cell id, leases and requests on it, plan routed then), in order."""
    events: list[tuple[str, int, int, object]] = []
    resources = runtime.resources
    create, drain, remove = resources.create_cell, resources.drain_cell, resources.remove_cell

    def busy(cell) -> int:
        return sum(r.in_flight + r.users for _, r in cell.members)

    async def create_cell(*args, **kwargs):
        cell = await create(*args, **kwargs)
        events.append(("add", cell.id, 0, runtime.plans.get(INTERNVL3.name)))
        return cell

    async def drain_cell(cell, *args, **kwargs):
        events.append(("drain", cell.id, busy(cell), runtime.plans.get(INTERNVL3.name)))
        return await drain(cell, *args, **kwargs)

    async def remove_cell(cell):
        events.append(("remove", cell.id, busy(cell), runtime.plans.get(INTERNVL3.name)))
        return await remove(cell)

    resources.create_cell, resources.drain_cell, resources.remove_cell = create_cell, drain_cell, remove_cell
    return events
