"""000 §7.4: request-static vs dynamic routing on the same deployment, and path-level dynamic routing.

The deployment is the planner's plan for InternVL3-like on 16 GPUs under Table 3's "Less text"
workload (the paper's §7.4 uses its plan for that setting: dedicated encoders plus monoliths).
Each system is one `prismserve serve --routing MODE`:
- `static`: the path is taken from the plan once per request (smooth weighted round-robin) and
  replicas by fewest leases, asking no one.
- `dynamic`: before every invocation the dispatcher asks every replica of that step for its queue
  depth and picks the shortest (paths still follow the plan's probabilities).
- `tokens`: replicas by fewest pending tokens, counted locally (ModServe's token-aware routing).
- `path`: path-level dynamic: at a request's entry its whole path is the least loaded of the
  plan's paths for its type (the busiest hop's pending work per replica, counted locally), then
  followed as `static` follows its path.
Run: python benchmarks/paper/sec74_routing.py [--requests 400] [--speedup 4] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fig10_internvl3 import GPUS, TABLE3  # noqa: E402
from harness import (  # noqa: E402
    Server,
    add_out_argument,
    describe_workload,
    measure,
    plan_for,
    retime,
    started,
    write,
)

from prismserve.bench.plots import throughput_bars  # noqa: E402
from prismserve.bench.workloads import controlled  # noqa: E402
from prismserve.emulate.catalog import INTERNVL3  # noqa: E402

PAPER = {"static_rps": 9.27, "dynamic_rps": 2.50, "ratio": 3.7}
POLICIES = ("static", "dynamic", "tokens", "path")
NAME = "sec74_routing"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--speedup", type=float, default=4.0)
    parser.add_argument("--load", type=float, default=1.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=["static", "dynamic", "path"])
    parser.add_argument("--quick", action="store_true", help="40 requests at speedup 50, path routing only")
    add_out_argument(parser)
    args = parser.parse_args()
    if args.quick:
        # One server (each start is most of a short run): the new mode, end to end.
        args.requests, args.speedup, args.policies = 40, 50.0, ["path"]

    resolution, images, text_in, text_out = TABLE3["Less text"]
    requests = controlled(1.0, resolution, images, text_in, text_out, count=args.requests, seed=args.seed)
    plan = plan_for(INTERNVL3.planner_spec(requests), GPUS)
    rate = args.load * plan.throughput * args.speedup
    specs = retime(requests, rate)
    runs = {}
    for policy in args.policies:
        with started(lambda policy=policy: Server(INTERNVL3, GPUS, routing=policy)) as server:
            runs[policy] = measure(server, policy, plan, specs, args.speedup, args.requests // 10)
    out = {
        "workload": describe_workload(specs),
        "requests": args.requests,
        "speedup": args.speedup,
        "runs": {policy: run.to_json() for policy, run in runs.items()},
        "paper": PAPER,
    }
    if "static" in runs and "dynamic" in runs:
        out["static_over_dynamic"] = runs["static"].measured_rps / runs["dynamic"].measured_rps
        print(
            f"static / dynamic = {out['static_over_dynamic']:.2f}x (paper {PAPER['ratio']}x: "
            f"{PAPER['static_rps']} vs {PAPER['dynamic_rps']} req/s)"
        )
    throughput_bars(
        {policy: run.measured_rps for policy, run in runs.items()},
        args.out / f"{NAME}.png",
        predicted={policy: run.predicted_rps for policy, run in runs.items()},
        title="§7.4 InternVL3-like, 16 GPUs, Less text: routing (req/s, A100 scale)",
    )
    print("wrote", write(NAME, out, args.out))


def _load(results: Path) -> dict | None:
    path = results / f"{NAME}.json"
    return json.loads(path.read_text()) if path.exists() else None


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    """README rows: each mode's throughput against static, as the paper's 3.7x compares them."""
    data = _load(results)
    if data is None:
        return [("§7.4: static / dynamic routing throughput", "3.7x", "not run", "-", f"no {NAME}.json")]
    runs = {policy: run["measured_rps"] for policy, run in data["runs"].items()}
    out = []
    why = (
        "our dynamic's queue queries are one local actor round trip per step, cheap at ~20 req/s, and "
        "our static already picks replicas by in-flight counts; the paper's queries cost far more"
    )
    if "static" in runs and "dynamic" in runs:
        ratio = runs["static"] / runs["dynamic"]
        out.append(
            (
                "§7.4: static / dynamic routing throughput",
                f"{PAPER['ratio']}x ({PAPER['static_rps']} / {PAPER['dynamic_rps']} req/s)",
                f"{ratio:.2f}x ({runs['static']:.2f} / {runs['dynamic']:.2f} req/s)",
                f"{ratio / PAPER['ratio']:.2f}",
                why,
            )
        )
    if "static" not in runs:  # a run of other modes only (`--quick`: path)
        return [
            (f"§7.4: {policy} routing throughput", "-", f"{rps:.2f} req/s", "-", "no static run to compare")
            for policy, rps in runs.items()
        ]
    for policy in ("tokens", "path"):
        if "static" in runs and policy in runs:
            ratio = runs["static"] / runs[policy]
            out.append(
                (
                    f"§7.4: static / {policy} routing throughput",
                    "-",
                    f"{ratio:.2f}x ({runs['static']:.2f} / {runs[policy]:.2f} req/s)",
                    "-",
                    "not in the paper: path-level dynamic (`--routing path`), a whole path chosen at "
                    "entry by the work in flight along it"
                    if policy == "path"
                    else "not in the paper (ModServe's token-aware replica choice)",
                )
            )
    return out


def details(results: Path) -> str:
    """A markdown table: every mode's predicted and measured throughput, latency and failures."""
    data = _load(results)
    if data is None:
        return ""
    lines = [
        f"§7.4, InternVL3-like on 16 GPUs, Less text, {data['workload']['requests']} requests, "
        f"sim speedup {data.get('speedup', '-')} (req/s at A100 scale):",
        "",
        "| routing | predicted | measured | measured / static | requests / makespan | P50 latency (s, sim) | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    static = data["runs"].get("static", {}).get("measured_rps")
    for policy, run in data["runs"].items():
        summary = run["summary"]
        ratio = f"{run['measured_rps'] / static:.2f}" if static else "-"
        lines.append(
            f"| {policy} | {run['predicted_rps']:.3f} | {run['measured_rps']:.3f} | {ratio} | "
            f"{run['makespan_rps']:.3f} | {summary['latency_s']['p50']:.2f} | {summary['failed']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
