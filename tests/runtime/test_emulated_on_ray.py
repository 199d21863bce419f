"""An emulated Qwen2.5-Omni on the Ray runtime, planned, deployed over the admin API, loaded by the bench client."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from runtime_apps import started_with_gateway

from prismserve.bench.loadgen import run_load
from prismserve.bench.metrics import summarize
from prismserve.bench.workloads import Arrivals, servegen
from prismserve.emulate import QWEN25_OMNI
from prismserve.emulate.app import app_source
from prismserve.emulate.model import DEPLOYMENT_PREFIX
from prismserve.gateway import create_gateway
from prismserve.planner import plan_for_budget
from prismserve.runtime.ray_runtime import RayRuntime

TOKEN = "emulated-token"


@pytest.fixture
def omni_server(ray_cluster, serve_gateway):
    runtime = RayRuntime()
    with (
        serve_gateway(
            create_gateway(runtime, admin_token=TOKEN, lifespan=started_with_gateway(runtime))
        ) as url,
        httpx.Client(base_url=url, timeout=300, headers={"authorization": f"Bearer {TOKEN}"}) as admin,
    ):
        response = admin.post(
            "/admin/apps", json={"name": QWEN25_OMNI.name, "source": app_source(QWEN25_OMNI.name)}
        )
        assert response.status_code == 201, response.text
        yield url, admin


def test_planned_omni_serves_an_any_to_any_workload(omni_server):
    url, admin = omni_server
    spec = QWEN25_OMNI.planner_spec(servegen(Arrivals("poisson", 1.0), count=2000, any_to_any=True, seed=5))
    plan = plan_for_budget(spec, 4, max_exponent=2)  # one node of the test cluster
    deployment = QWEN25_OMNI.deployment_plan(plan, speedup=500)  # sim times / 500: a fast test
    response = admin.post(f"/admin/apps/{QWEN25_OMNI.name}/plan", json=deployment.model_dump(mode="json"))
    assert response.status_code == 200, response.text
    status = admin.get("/admin/status").json()
    keys = status["apps"][QWEN25_OMNI.name]["deployments"]  # deployment path -> key
    planned: dict[str, int] = {}  # by deployment key: each option's replicas over all its cells
    for cell in plan.cells:
        for option, replicas in cell.replicas.items():
            key = keys[DEPLOYMENT_PREFIX + option]
            planned[key] = planned.get(key, 0) + replicas * cell.count
    deployed: dict[str, int] = {}
    for cell in status["cells"]:
        for key, replicas in cell["replicas"].items():
            deployed[key] = deployed.get(key, 0) + replicas
    # Per deployment, not as a multiset: two options with swapped counts would not pass.
    assert deployed == {k: r for k, r in planned.items() if r}

    # Real media through the OpenAI API: images, audio clips, videos; a fifth ask for speech.
    specs = servegen(Arrivals("poisson", 20.0), count=24, any_to_any=True, seed=6)
    results = asyncio.run(run_load(url, QWEN25_OMNI.name, specs, progress=False))
    summary = summarize(results)
    assert summary["failed"] == 0, summary["errors"]
    assert any("video" in t for t in summary["by_type"]) and any(
        t.endswith("->audio") for t in summary["by_type"]
    )
