"""Per-stage autoscaling (ModServe, 003 §4.2) on the in-process control plane: the stages of the
sim MLLM scaled by their token load through the plan diff, without losing a request."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from runtime_apps import ENCODER, LLM, SIM_MLLM, first_token_s, plan, png, serving, started_with_gateway

from prismserve.bench.loadgen import run_load
from prismserve.bench.workloads import RequestSpec
from prismserve.control.autoscale import Autoscaler
from prismserve.control.slo import SLOWindow
from prismserve.gateway import create_gateway
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime

TOKEN = "autoscale-admin-token"

IMAGE = png(700, 700)  # 625 tokens
# One encoder serves 0.8 / 0.0002 = 4000 tokens/s within its SLO (6.4 images/s), by its sim profile.
ENCODER_PROFILE = {"token_s": 0.0002}
LLM_PROFILE = {"items": 1}


def autoscale(**settings) -> str:
    fields = {"stages": [ENCODER], "interval_s": 0.2, "window_s": 0.6, "scale_in_after_s": 0.6, **settings}
    return f"    autoscale = {fields!r}"


def encoders(runtime) -> int:
    return runtime.plans["vl"].replicas().get(ENCODER, 0)


def test_a_step_in_load_adds_encoders_and_removes_them_after_without_losing_a_request():
    async def scenario(runtime, app):
        scaler = Autoscaler(runtime, app)
        scaler.start()
        counts, sent = [], []

        async def load(per_s: float, seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                sent.append(
                    asyncio.ensure_future(first_token_s(runtime, app, ChatRequest.of("look", images=[IMAGE])))
                )
                counts.append(encoders(runtime))
                await asyncio.sleep(1 / per_s)

        try:
            await load(2, 1.0)  # 1250 tokens/s: one encoder
            await load(20, 3.0)  # 12500 tokens/s: four
            await load(2, 3.0)
            results = await asyncio.gather(*sent, return_exceptions=True)
            counts.append(encoders(runtime))
        finally:
            await scaler.close()
        return counts, results, scaler.changes

    counts, results, changes = serving(autoscale(), plan(1, 1, ENCODER_PROFILE, LLM_PROFILE), scenario)
    assert [r for r in results if isinstance(r, BaseException)] == []  # every request answered
    assert counts[0] == 1 and max(counts) >= 3 and counts[-1] <= 2, counts
    assert changes >= 2


def test_scaling_holds_through_a_short_dip_keeps_its_bounds_and_budget_and_answers_missed_slos():
    """Decisions on a fake clock with token counts set by hand: a dip shorter than `scale_in_after_s`
    removes nothing, one longer does; min/max replicas and the GPU budget bound every change; SLO
    attainment below target adds a replica to the busiest stage, once per SLO window, and holds
    scale-ins."""

    async def scenario(runtime, app):
        now = [0.0]
        slo = SLOWindow()
        scaler = Autoscaler(runtime, app, slo, clock=lambda: now[0])
        manager = runtime.managers[app.named_unit_tasks()[ENCODER].deployment_key()]
        seen = []

        async def tick(tokens_per_s: float) -> None:
            now[0] += 1.0
            manager.tokens += int(tokens_per_s)
            await scaler.check()
            seen.append(encoders(runtime))

        await tick(0)
        await tick(20000)  # 5 x 4000 tokens/s: 5, the max
        await tick(20000)
        await tick(100)  # a dip of 2 s: the hold is 3 s
        await tick(100)
        await tick(20000)
        for _ in range(5):
            await tick(100)  # a long dip: down to the min
        for _ in range(60):
            slo.record(False, time.monotonic())  # the SLO is missed: one more, at low load
        await tick(100)
        await tick(100)  # not another while the misses before it are still in the window
        now[0] += slo.window_s
        await tick(100)  # still missed a window later: one more
        return seen

    settings = autoscale(
        interval_s=1.0,
        window_s=1.0,
        scale_in_after_s=3.0,
        min_replicas={ENCODER: 2},
        max_replicas={ENCODER: 5},
    )
    seen = serving(settings, plan(2, 1, ENCODER_PROFILE, LLM_PROFILE), scenario)
    assert seen[:6] == [2, 5, 5, 5, 5, 5], seen
    assert seen[9:11] == [2, 2] and seen[-3:] == [3, 3, 4], seen

    budget = autoscale(interval_s=1.0, window_s=1.0, gpus=4)  # 1 LLM + at most 3 encoders

    async def over_budget(runtime, app):
        now = [0.0]
        scaler = Autoscaler(runtime, app, clock=lambda: now[0])
        manager = runtime.managers[app.named_unit_tasks()[ENCODER].deployment_key()]
        await scaler.check()
        now[0], manager.tokens = 1.0, 40000
        await scaler.check()
        return encoders(runtime), runtime.plans["vl"].total_gpus

    assert serving(budget, plan(1, 1, ENCODER_PROFILE, LLM_PROFILE), over_budget) == (3, 4)


def test_a_stage_of_a_real_engine_needs_its_capacity_given():
    async def scenario(runtime, app):
        scaler = Autoscaler(runtime, app)
        return scaler.capacity(ENCODER), scaler.capacity(LLM)

    settings = autoscale(stages=[ENCODER, LLM], capacity={LLM: 900.0})
    encoder, llm = serving(settings, plan(1, 1, ENCODER_PROFILE, LLM_PROFILE), scenario)
    assert encoder == pytest.approx(4000) and llm == 900.0
    no_tokens = serving(settings, plan(1, 1, {"latency_s": 0.01}, LLM_PROFILE), scenario)
    assert no_tokens == (None, 900.0)  # warned once, that stage left alone


def test_an_app_registered_with_autoscaling_is_scaled_behind_the_gateway_and_stops_with_it(serve_gateway):
    """Through the admin API and the OpenAI API: the autoscaler starts with the app, shows in
    /metrics, scales the encoders out under a burst and in after it, every request answered; it
    stops when the app is unregistered."""
    runtime = RayRuntime(pool=InProcessPool({"node": 16}))
    gateway = create_gateway(runtime, admin_token=TOKEN, lifespan=started_with_gateway(runtime))
    source = SIM_MLLM.format(config=autoscale())
    deployed = plan(1, 1, ENCODER_PROFILE, LLM_PROFILE).model_dump(mode="json")
    burst = [RequestSpec(i / 25, 20, 1, images=((700, 700),)) for i in range(75)]  # 3 s at 15600 tokens/s

    def replicas(text: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith("prismserve_autoscale_replicas{"))
        return float(line.split()[-1])

    with (
        serve_gateway(gateway) as url,
        httpx.Client(base_url=url, timeout=60, headers={"authorization": f"Bearer {TOKEN}"}) as admin,
    ):
        assert admin.post("/admin/apps", json={"name": "vl", "source": source}).status_code == 201
        assert admin.post("/admin/apps/vl/plan", json=deployed).status_code == 200
        results = asyncio.run(run_load(url, "vl", burst, progress=False))
        peak = runtime.plans["vl"].replicas()[ENCODER]
        deadline = time.monotonic() + 20
        while replicas(admin.get("/metrics").text) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        metrics = admin.get("/metrics").text
        assert admin.delete("/admin/apps/vl").status_code == 200
        assert gateway.state.gateway.controls.autoscalers == {}
    assert [r.error for r in results if not r.ok] == []
    assert peak >= 3 and replicas(metrics) == 1
    assert 'prismserve_autoscale_changes{app="vl"}' in metrics


def test_a_plan_of_deployment_options_is_left_to_re_planning(caplog):
    async def scenario(runtime, app):
        now = [0.0]
        scaler = Autoscaler(runtime, app, clock=lambda: now[0])
        options = runtime.plans["vl"].model_copy(update={"options": {"E": {ENCODER: 1.0}}})
        runtime.plans["vl"] = options  # as `serve --gpus` deploys: cells of deployment options
        manager = runtime.managers[app.named_unit_tasks()[ENCODER].deployment_key()]
        await scaler.check()
        now[0], manager.tokens = 1.0, 40000  # ten encoders' worth
        return await scaler.check(), runtime.plans["vl"] is options

    assert serving(autoscale(), plan(1, 1, ENCODER_PROFILE, LLM_PROFILE), scenario) == (None, True)
    assert "its plan is of deployment options" in caplog.text
