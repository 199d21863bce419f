"""An emulated model's profile measured on its replicas against the emulation's own cost model.

`prismserve serve --gpus N` profiles an emulated app by timing one `sim` replica of each deployment
option (`prismserve/profile/shaped.py`); the emulation also knows each option's exact full-batch
rate (`EmulatedModel.served_spec`). This prints, per option, measured throughput / cost model's and
writes both specs' figures as JSON. In process (no Ray actors), on declared GPUs. With `--gpus`, per
GPU budget, the capacity under the emulation's own costs (`EmulatedModel.capacity`) of the plan
made from the measured profile and of the plan made from the cost model (the best plan): what
the profile's errors cost, without serving either.
With `--profile FILE` a profile the server made (`prismserve serve --gpus N --profile-workload`, as
the paper scripts run it; the file its start-up line names) is compared instead of measuring anew:
give the workload it was measured on (`--requests`, `--seed`) and its speedup.
Run: python benchmarks/bench_profile_emulated.py [--model internvl3-38b] [--speedup 20]
     [--requests 200] [--seed 5] [--profile FILE] [--gpus 8 16] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any


async def measure(
    model: str, speedup: float, requests: int, seed: int, given: str | None, budgets: list[int]
) -> dict[str, Any]:
    """Profile `model`'s app on in-process replicas (or read the profile `given`); each option's
    measured and exact figures, and the plans' capacities for each GPU budget of `budgets`."""
    os.environ["PRISMSERVE_SIM_SPEEDUP"] = str(speedup)  # read when the app's module loads
    from prismserve.bench.workloads import Arrivals, servegen
    from prismserve.emulate.app import app_source
    from prismserve.emulate.catalog import MODELS
    from prismserve.planner import load_spec
    from prismserve.profile import profile
    from prismserve.runtime.pool import InProcessPool
    from prismserve.runtime.ray_runtime import RayRuntime

    emulated = MODELS[model]
    specs = servegen(Arrivals("poisson", 1.0), count=requests, any_to_any=model == "qwen25-omni", seed=seed)
    started = time.perf_counter()
    if given is not None:
        measured = load_spec(given)
    else:
        runtime = RayRuntime(pool=InProcessPool({"a": 32}))
        await runtime.start()
        try:
            app = await runtime.register_app(app_source(model), model)
            measured = await profile(runtime, app, specs)
        finally:
            await runtime.close()
    seconds = time.perf_counter() - started
    exact = emulated.served_spec(specs, speedup)
    return {
        "model": model,
        "speedup": speedup,
        "requests": requests,
        "seed": seed,
        "profile": given,
        "profile_s": None if given else seconds,
        "options": {
            o.name: {
                "measured_rps": o.throughput,
                "cost_model_rps": exact.option(o.name).throughput,
                "ratio": o.throughput / exact.option(o.name).throughput,
            }
            for o in measured.options
        },
        "plans": {str(gpus): plan_capacities(emulated, specs, measured, exact, gpus) for gpus in budgets},
    }


def plan_capacities(
    emulated: Any, specs: list[Any], measured: Any, exact: Any, gpus: int
) -> dict[str, float]:
    """The capacity (req/s, A100 scale) under the emulation's own costs of the plans for `gpus` GPUs
    made from the `measured` spec and from the `exact` one, planned as `serve --gpus` plans."""
    from prismserve.planner import plan_for_budget

    capacity = {}
    for label, spec in (("measured_plan_rps", measured), ("best_plan_rps", exact)):
        plan = plan_for_budget(spec, gpus)
        capacity[label] = emulated.capacity(plan.replicas(), plan.routing, specs)
    return {**capacity, "share": capacity["measured_plan_rps"] / capacity["best_plan_rps"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="internvl3-38b")
    parser.add_argument("--speedup", type=float, default=20.0, help="sim time divisor")
    parser.add_argument(
        "--requests", type=int, default=200, help="workload size (ServeGen image; any-to-any for qwen25-omni)"
    )
    parser.add_argument("--seed", type=int, default=5, help="workload seed (the paper scripts: 0)")
    parser.add_argument("--profile", help="compare this profile file instead of measuring one")
    parser.add_argument(
        "--gpus", type=int, nargs="*", default=[], help="GPU budgets to plan for from both specs"
    )
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(
        measure(args.model, args.speedup, args.requests, args.seed, args.profile, args.gpus)
    )
    if args.profile:
        print(f"{args.model}, speedup {args.speedup:g}: {args.profile}")
    else:
        print(f"{args.model}, speedup {args.speedup:g}: profiled in {results['profile_s']:.0f} s")
    print(f"{'option':<10} {'measured':>10} {'cost model':>11} {'ratio':>6}  (req/s as served)")
    for name, row in results["options"].items():
        print(f"{name:<10} {row['measured_rps']:>10.3f} {row['cost_model_rps']:>11.3f} {row['ratio']:>6.2f}")
    for gpus, row in results["plans"].items():
        print(
            f"{gpus} GPUs: the measured profile's plan {row['measured_plan_rps']:.3f} req/s, the best plan "
            f"{row['best_plan_rps']:.3f} ({row['share']:.2f}; the emulation's costs, A100 scale)"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
