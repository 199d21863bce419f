"""000 §7.4: request-static vs dynamic routing on the same deployment.

The deployment is the planner's plan for InternVL3-like on 16 GPUs under Table 3's "Less text"
workload (the paper's §7.4 uses its plan for that setting: dedicated encoders plus monoliths).
`static`: the path is sampled from the plan once per request and replicas are taken round-robin,
asking no one. `dynamic`: before every invocation the dispatcher asks every replica of that step
for its queue depth and picks the shortest (paths still follow the plan's probabilities).
Run: python benchmarks/paper/sec74_routing.py [--requests 400] [--speedup 4]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fig10_internvl3 import GPUS, TABLE3
from harness import RESULTS, Server, describe_workload, measure, plan_for, retime, write

from prismserve.bench.workloads import controlled
from prismserve.emulate.catalog import INTERNVL3

PAPER = {"static_rps": 9.27, "dynamic_rps": 2.50, "ratio": 3.7}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--speedup", type=float, default=4.0)
    parser.add_argument("--load", type=float, default=1.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where to write JSON and PNG (default benchmarks/results)",
    )
    args = parser.parse_args()

    resolution, images, text_in, text_out = TABLE3["Less text"]
    requests = controlled(1.0, resolution, images, text_in, text_out, count=args.requests, seed=args.seed)
    plan = plan_for(INTERNVL3.planner_spec(requests), GPUS)
    rate = args.load * plan.throughput * args.speedup
    specs = retime(requests, rate)
    runs = {}
    for policy in ("static", "dynamic"):
        with Server(INTERNVL3, GPUS, routing=policy) as server:
            runs[policy] = measure(server, policy, plan, specs, args.speedup, args.requests // 10)
    ratio = runs["static"].measured_rps / runs["dynamic"].measured_rps
    print(
        f"static / dynamic = {ratio:.2f}x (paper {PAPER['ratio']}x: {PAPER['static_rps']} vs {PAPER['dynamic_rps']} req/s)"
    )
    print(
        "wrote",
        write(
            "sec74_routing",
            {
                "workload": describe_workload(specs),
                "runs": {policy: run.to_json() for policy, run in runs.items()},
                "static_over_dynamic": ratio,
                "paper": PAPER,
            },
            args.results,
        ),
    )


if __name__ == "__main__":
    main()
