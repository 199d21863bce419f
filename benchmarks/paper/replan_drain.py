"""A plan change on a full cluster under load: Figure 6a's Qwen2.5-Omni plan on 8 GPUs (one 8-GPU
cell) served at `--load` times its capacity, and `--after` seconds into the arrivals the plan for a
mix with three times the speech answers is posted: two 4-GPU cells, so the running cell is drained
and removed before they start. Prints the requests that failed (the runtime promises none).
Both plans are the planner's on the emulation's analytic spec (`planner_spec`), posted to the
server: what is measured is the change, not a profile, and the server's own profiling of the
model at start (minutes at a low speedup) would add nothing to it.

    cd benchmarks/paper; python3 replan_drain.py [--requests 1500] [--load 1.25] [--after 40]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections import Counter

from harness import Server, retime

from prismserve.bench.loadgen import run_load
from prismserve.bench.metrics import summarize
from prismserve.bench.workloads import Arrivals, servegen
from prismserve.emulate import QWEN25_OMNI
from prismserve.planner import plan_for_budget, spec_at_mix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--load", type=float, default=1.25, help="arrival rate over the plan's capacity")
    parser.add_argument(
        "--after", type=float, default=40.0, help="seconds into the arrivals to change the plan"
    )
    parser.add_argument("--speedup", type=float, default=4.0)
    args = parser.parse_args()

    model = QWEN25_OMNI
    requests = servegen(Arrivals("poisson", 1.0), count=args.requests, any_to_any=True, seed=0)
    spec = model.planner_spec(requests)
    counts = Counter(r.request_type for r in requests)
    speech = {t: n * (3 if t.endswith("->audio") else 1) for t, n in counts.items()}
    planned = plan_for_budget(spec, 8)
    other = plan_for_budget(spec_at_mix(spec, speech), 8)
    with Server(model, 8, speedup=args.speedup) as server:
        server.deploy(planned, args.speedup)
        rate = args.load * planned.throughput * args.speedup
        specs = retime(requests, rate)
        changed: list[float] = []

        def change() -> None:
            start = time.monotonic()
            server.deploy(other, args.speedup)
            changed.append(time.monotonic() - start)

        timer = threading.Timer(args.after, change)
        timer.start()
        results = asyncio.run(run_load(server.url, model.name, specs, progress=False))
        timer.join()
    summary = summarize(results)
    print(
        f"{len(specs)} requests at {rate:.1f} req/s ({args.load:g}x the plan's capacity); plan "
        f"{[(c.gpus, c.count, c.replicas) for c in planned.cells]} -> {[(c.gpus, c.count, c.replicas) for c in other.cells]} "
        f"posted at {args.after:g} s, applied in {changed[0]:.1f} s; failed {summary['failed']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
