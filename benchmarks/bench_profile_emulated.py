"""An emulated model's profile measured on its replicas against the emulation's own cost model.

`prismserve serve --gpus N` profiles an emulated app by timing one `sim` replica of each deployment
option (`prismserve/profile/shaped.py`); the emulation also knows each option's exact full-batch
rate (`EmulatedModel.served_spec`). This prints, per option, measured throughput / cost model's and
writes both specs' figures as JSON. In process (no Ray actors), on declared GPUs.
Run: python benchmarks/bench_profile_emulated.py [--model internvl3-38b] [--speedup 20]
     [--requests 200] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any


async def measure(model: str, speedup: float, requests: int) -> dict[str, Any]:
    """Profile `model`'s app on in-process replicas; each option's measured and exact figures."""
    os.environ["PRISMSERVE_SIM_SPEEDUP"] = str(speedup)  # read when the app's module loads
    from prismserve.bench.workloads import Arrivals, servegen
    from prismserve.emulate.app import app_source
    from prismserve.emulate.catalog import MODELS
    from prismserve.profile import profile
    from prismserve.runtime.pool import InProcessPool
    from prismserve.runtime.ray_runtime import RayRuntime

    emulated = MODELS[model]
    specs = servegen(Arrivals("poisson", 1.0), count=requests, any_to_any=model == "qwen25-omni", seed=5)
    runtime = RayRuntime(pool=InProcessPool({"a": 32}))
    await runtime.start()
    try:
        app = await runtime.register_app(app_source(model), model)
        started = time.perf_counter()
        measured = await profile(runtime, app, specs)
        seconds = time.perf_counter() - started
    finally:
        await runtime.close()
    exact = emulated.served_spec(specs, speedup)
    return {
        "model": model,
        "speedup": speedup,
        "requests": requests,
        "profile_s": seconds,
        "options": {
            o.name: {
                "measured_rps": o.throughput,
                "cost_model_rps": exact.option(o.name).throughput,
                "ratio": o.throughput / exact.option(o.name).throughput,
            }
            for o in measured.options
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="internvl3-38b")
    parser.add_argument("--speedup", type=float, default=20.0, help="sim time divisor")
    parser.add_argument("--requests", type=int, default=200, help="workload size (servegen image)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.model, args.speedup, args.requests))
    print(f"{args.model}, speedup {args.speedup:g}: profiled in {results['profile_s']:.0f} s")
    print(f"{'option':<10} {'measured':>10} {'cost model':>11} {'ratio':>6}  (req/s as served)")
    for name, row in results["options"].items():
        print(f"{name:<10} {row['measured_rps']:>10.3f} {row['cost_model_rps']:>11.3f} {row['ratio']:>6.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
