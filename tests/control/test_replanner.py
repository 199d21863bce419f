"""The re-planning watcher's hysteresis, with a fake clock and a runtime that only records plans."""

from __future__ import annotations

import asyncio
import logging

import pytest
from toy.specs import ENCODER_LLM

from prismserve.control import Controls, Replanner, total_variation
from prismserve.gateway.metrics import GatewayMetrics
from prismserve.planner import Plan, parse_spec, plan_for_budget, plan_for_target, spec_at_mix
from prismserve.runtime import LocalRuntime

SPEC = parse_spec(ENCODER_LLM)  # planned for 90 % text


class RecordingRuntime(LocalRuntime):
    """Deploys nothing: keeps the plans it is given."""

    def __init__(self, executors=None) -> None:
        super().__init__(executors)
        self.deployed: list[Plan] = []

    async def deploy(self, app_name: str, plan: Plan) -> None:
        self.deployed.append(plan)


class Traffic:
    """Requests at `rate` per second on a fake clock, `images` of every 10 with an image; the watcher
    is checked every `interval` seconds."""

    def __init__(self, replanner: Replanner, rate: float = 10.0, interval: float = 0.5) -> None:
        self.replanner, self.rate, self.interval = replanner, rate, interval
        self.now = 0.0
        self.sent = 0

    def run(self, seconds: float, images: int) -> None:
        async def drive() -> None:
            end = self.now + seconds
            next_check = self.now + self.interval
            while self.now < end:
                kind = "image+text" if self.sent % 10 < images else "text"
                self.replanner.observe(kind, self.now)
                self.sent += 1
                self.now += 1 / self.rate
                if self.now >= next_check:
                    await self.replanner.check(self.now)
                    next_check += self.interval

        asyncio.run(drive())


def watcher(runtime: RecordingRuntime, **settings) -> Replanner:
    defaults = {"window_s": 4.0, "interval_s": 0.5, "min_requests": 10, "sustain_s": 6.0, "cooldown_s": 30.0}
    return Replanner(
        runtime,
        "app",
        SPEC,
        gpus=4,
        plan=plan_for_budget(SPEC, 4),
        clock=lambda: 0.0,
        **{**defaults, **settings},
    )


def test_a_blip_does_not_replan_a_sustained_shift_does_once_and_none_follows_in_the_cooldown():
    runtime = RecordingRuntime()
    replanner = watcher(runtime)
    traffic = Traffic(replanner)
    traffic.run(10, images=1)  # the planned mix
    assert runtime.deployed == []
    traffic.run(2, images=10)  # a 2-s burst of images drifts the window's mix past 0.15 for < 6 s
    assert replanner.status().drift > 0.15
    traffic.run(13, images=1)
    assert runtime.deployed == [] and replanner.replans == 0

    traffic.run(15, images=9)  # 90 % images from t = 25 s on
    assert len(runtime.deployed) == 1 and replanner.replans == 1
    (event,) = replanner.history
    assert 25 + 6 <= event.at <= 25 + 6 + 2  # held for sustain_s (after ~1 s of window lag)
    assert event.shares["image+text"] == pytest.approx(0.9, abs=0.05)
    assert "mix drifted" in event.reason
    # The plan deployed is the planner's for the observed mix, and predicted 2x the capacity there.
    assert runtime.deployed[0] == plan_for_budget(spec_at_mix(SPEC, event.shares), 4)
    assert runtime.deployed[0].replicas() == {"E": 2, "L": 2}
    assert event.capacity_after == pytest.approx(2 * event.capacity_before, rel=0.05)

    traffic.run(20, images=1)  # back to text at t = 40 s: drifted, but inside the cool-down
    assert len(runtime.deployed) == 1
    traffic.run(15, images=1)  # the cool-down ends at event.at + 30 s
    assert len(runtime.deployed) == 2
    assert replanner.history[-1].at >= event.at + 30
    assert runtime.deployed[1].replicas() == {"E": 1, "L": 3}


def test_on_a_budget_load_beyond_the_plans_capacity_replans_nothing(caplog):
    """The plan is the planner's best for its mix on these GPUs whatever the load: re-planning a
    saturated deployment would only drain its cells under that load."""
    runtime = RecordingRuntime()
    replanner = watcher(runtime)
    with caplog.at_level(logging.INFO, logger="prismserve.control.replan"):
        Traffic(replanner, rate=13.0).run(20, images=1)  # above the 12 req/s the plan sustains
    assert replanner.status().capacity == pytest.approx(12.0)
    assert runtime.deployed == [] and "re-plan" not in caplog.text


def test_a_plan_that_is_not_better_by_the_margin_is_not_deployed(caplog):
    runtime = RecordingRuntime()
    replanner = watcher(runtime, margin=0.25)
    with caplog.at_level(logging.INFO, logger="prismserve.control.replan"):
        Traffic(replanner).run(20, images=3)  # 30 % images: drifted by 0.2
    # The plan for 30 % images (2 E + 2 L: 8 req/s) is 20 % above the one running (1 E: 6.7 req/s).
    assert runtime.deployed == []
    assert "kept the plan deployed, the new plan's 8 req/s is not 25% above 6.67" in caplog.text


def test_serving_for_a_target_shrinks_a_plan_the_load_stays_far_below():
    runtime = RecordingRuntime()
    replanner = Replanner(
        runtime,
        "app",
        SPEC,
        target=12.0,
        plan=plan_for_target(SPEC, 12.0),
        window_s=4.0,
        interval_s=0.5,
        min_requests=5,
        sustain_s=2.0,
        clock=lambda: 0.0,
    )
    Traffic(replanner, rate=2.0).run(10, images=1)  # 2 req/s, under 40 % of 12
    (plan,) = runtime.deployed
    assert plan == plan_for_target(spec_at_mix(SPEC, replanner.history[0].shares), 2.0 * 1.25)
    assert plan.total_gpus < 4


def test_the_metrics_show_the_watchers_state():
    runtime = RecordingRuntime()
    replanner = watcher(runtime)
    Traffic(replanner).run(5, images=1)
    controls = Controls(runtime)
    controls.watch(replanner)
    metrics = GatewayMetrics(runtime, controls)
    replanner.clock = lambda: 5.0
    text = metrics.exposition().decode()
    assert 'prismserve_replan_observed_rps{app="app"} 10.0' in text
    assert 'prismserve_replan_observed_share{app="app",request_type="image+text"} 0.1' in text
    assert 'prismserve_replan_capacity_rps{app="app"} 12.0' in text
    assert 'prismserve_replans{app="app"} 0.0' in text


def test_total_variation_is_the_share_of_requests_that_changed_type():
    assert total_variation({"a": 0.9, "b": 0.1}, {"a": 0.1, "b": 0.9}) == pytest.approx(0.8)
    assert total_variation({"a": 1.0}, {"b": 1.0}) == pytest.approx(1.0)


def test_a_replanner_needs_exactly_one_of_a_budget_and_a_target():
    with pytest.raises(ValueError, match="exactly one of `gpus`"):
        Replanner(RecordingRuntime(), "app", SPEC)


def test_a_plan_posted_through_the_admin_api_takes_over_from_the_watcher(serve_gateway):
    import httpx
    from toy import MLLM_APP_PATH
    from toy.executors import EXECUTORS

    from prismserve.gateway import create_gateway

    runtime = RecordingRuntime(EXECUTORS)
    gateway = create_gateway(runtime, admin_token="t")
    replanner = watcher(runtime)
    with (
        serve_gateway(gateway) as url,
        httpx.Client(base_url=url, headers={"authorization": "Bearer t"}) as admin,
    ):
        assert (
            admin.post("/admin/apps", json={"name": "app", "source": MLLM_APP_PATH.read_text()}).status_code
            == 201
        )
        gateway.state.gateway.controls.watch(replanner)
        assert admin.post("/admin/apps/app/plan", json={"cells": []}).status_code == 200
    assert (
        "app" not in gateway.state.gateway.controls.replanners
    )  # it no longer re-plans over the posted plan
    assert runtime.deployed == [Plan(cells=[])]
