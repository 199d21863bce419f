"""An emulated app is profiled by running its replicas: the shape (options, types, paths) from its
`Config.planner_spec`, every time measured on one `sim` replica of each option, and `serve --gpus`
(`plan_at_start`) plans from that measured profile."""

from __future__ import annotations

import asyncio

from prismserve.bench.workloads import RequestSpec, write_requests
from prismserve.emulate.app import app_source
from prismserve.emulate.catalog import INTERNVL3
from prismserve.planner import plan_for_budget
from prismserve.profile import plan_at_start
from prismserve.profile.cache import cached
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.ray_runtime import RayRuntime

SPEEDUP = 4  # sim times / 4: a request's time on a replica is tens of milliseconds
# Heavy-tailed outputs (mean 64): a round of them started together would drain, its batch full only
# until the shortest ends, and the decoders' rate would be measured low (`requests.profile_requests`).
WORKLOAD = [
    RequestSpec(0.0, 40 + 10 * i, 208 if i % 4 == 0 else 16, images=((448 + 64 * (i % 3), 448),))
    for i in range(12)
]


def test_an_emulated_app_is_planned_from_its_replicas_measured_times(tmp_path, monkeypatch):
    monkeypatch.setenv("PRISMSERVE_SIM_SPEEDUP", str(SPEEDUP))
    monkeypatch.setenv("PRISMSERVE_PROFILE_CACHE", str(tmp_path / "cache"))
    write_requests(WORKLOAD, tmp_path / "w.jsonl")
    source = app_source(INTERNVL3.name)

    async def main():
        runtime = RayRuntime(pool=InProcessPool({"a": 16}))
        await runtime.start()
        try:
            app = await runtime.register_app(source, INTERNVL3.name)
            spec, plan, _ = await asyncio.wait_for(
                plan_at_start(runtime, app, source, 8, str(tmp_path / "w.jsonl")), 240
            )
            return spec, plan
        finally:
            await runtime.close()

    spec, plan = asyncio.run(main())
    exact = INTERNVL3.served_spec(WORKLOAD, SPEEDUP)  # the emulation's own costs: the known times
    assert [o.name for o in spec.options] == [o.name for o in exact.options]
    assert spec.request_types == exact.request_types and spec.components == exact.components
    ratios = []
    for option in spec.options:
        known = exact.option(option.name).role_seconds
        assert set(option.role_seconds) == set(known), option.name
        for request_type, roles in known.items():
            measured = option.role_seconds[request_type]
            # Roles reachable only by visiting a separable option twice are left to the planner.
            for role in set(measured):
                # Between the full-batch time (the emulation's cost) and the time alone (batch_gain
                # times that), with a margin for overhead on a shared machine.
                alone = INTERNVL3.option(option.name).batch_gain
                ratio = measured[role] / roles[role]
                assert 0.9 <= ratio <= alone * 1.3, (option.name, role, ratio)
                if role == "D":  # a continuous decoder: its round's requests end together, at full
                    # batch (it measured 1.97x its full-batch time on the workload's own outputs)
                    assert ratio <= 1.3, (option.name, ratio)
                ratios.append(ratio)
    assert max(abs(r - 1) for r in ratios) > 0.01  # measured, not the cost model copied
    # `serve --gpus` planned from the measured profile, which the cache holds for a restart.
    assert plan.throughput == plan_for_budget(spec, 8).throughput
    assert plan.throughput < plan_for_budget(exact, 8).throughput
    (profile_file,) = (tmp_path / "cache").rglob("*.yaml")
    assert cached(profile_file) == spec
    # Keyed by the sim speed too: a server started at another speedup measures again.
    assert f"# sim speedup: {SPEEDUP}\n" in profile_file.read_text()
