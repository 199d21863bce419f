"""000 Figure 11: latency CDFs of an InternVL3-38B-like model on 16 GPUs, the planner's plan vs the
monolith (8 x EPD on 2 GPUs), under two controlled workloads.

- 11a: Table 3's *Less text* (one 1920x1080 image, 100 tokens in, 100 out): the workload whose plan
  Figure 11's caption names, "4.1 + 6.2" (four 1-GPU encoders and six 2-GPU monoliths) vs "8.2".
- 11b: 300 tokens in and 300 out, 20 % of requests with eight 1920x1080 images (000 §7.3.2).
Each deployment runs twice on the same requests: overloaded (`--load` x the plan's predicted
throughput) for its capacity, as every reproduction here measures throughput; and at one common
rate, `--latency-load` x the monolith's predicted capacity, for the latency CDF (an overloaded
run's latencies only grow with its length). The paper gives no latency percentiles for Figure 11:
its rows compare our P50/P90/P99 ratios with a plot only, and 11b's throughput with its 1.26x.
Run: python benchmarks/paper/fig11_latency_cdf.py [--requests 600] [--speedup 4] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fig10_internvl3 import GPUS, TABLE3, load  # noqa: E402
from harness import Server, add_out_argument, describe_workload, measure, plan_for, retime, write  # noqa: E402

from prismserve.bench.plots import latency_cdf  # noqa: E402
from prismserve.bench.workloads import RequestSpec, controlled  # noqa: E402
from prismserve.emulate.catalog import INTERNVL3, INTERNVL3_BASELINES  # noqa: E402

NAME = "fig11_latency_cdf"
PAPER_11B_THROUGHPUT = 1.26  # 000 §7.3.2: plan / monolith on the skewed workload
SKEWED_SHARE, SKEWED_IMAGES = 0.2, 8
PANELS = ("11a Less text", "11b skewed")


def skewed(count: int, seed: int) -> list[RequestSpec]:
    """11b's workload: 300 tokens in, 300 out; 20 % of requests carry eight 1920x1080 images."""
    base = controlled(1.0, (1920, 1080), SKEWED_SHARE, 300, 300, count=count, seed=seed)
    return [
        RequestSpec(s.arrival_s, s.text_tokens, s.output_tokens, images=s.images * SKEWED_IMAGES)
        for s in base
    ]


def workloads(count: int, seed: int) -> dict[str, list[RequestSpec]]:
    """Figure 11's two workloads by panel."""
    resolution, images, text_in, text_out = TABLE3["Less text"]
    return {
        "11a Less text": controlled(1.0, resolution, images, text_in, text_out, count=count, seed=seed),
        "11b skewed": skewed(count, seed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--speedup", type=float, default=4.0, help="sim time divisor (default 4)")
    parser.add_argument("--load", type=float, default=1.25, help="capacity runs: rate / plan's predicted rps")
    parser.add_argument("--latency-load", type=float, default=0.9, help="latency runs: rate / monolith's rps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--panels", nargs="+", choices=PANELS, default=list(PANELS))
    parser.add_argument("--quick", action="store_true", help="a tiny run: 11b, 40 requests at speedup 50")
    add_out_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.speedup, args.panels = 40, 50.0, ["11b skewed"]
    out: dict = {"model": INTERNVL3.name, "gpus": GPUS, "requests": args.requests, "panels": {}}
    for panel, requests in workloads(args.requests, args.seed).items():
        if panel not in args.panels:
            continue
        out["panels"][panel] = run_panel(panel, requests, args)
        runs = out["panels"][panel]["latency"]
        latency_cdf(
            {label: run["latencies_s"] for label, run in runs.items()},
            args.out / f"{NAME}_{panel.split()[0]}.png",
            title=f"InternVL3-like, {GPUS} GPUs, {panel[4:]} (A100-scale s)",
        )
    print("wrote", write(NAME, out, args.out))


def run_panel(panel: str, requests: list[RequestSpec], args: argparse.Namespace) -> dict:
    """Capacity and latency runs of the plan and the monolith on one workload."""
    model = INTERNVL3
    monolith = plan_for(model.restricted(model.planner_spec(requests), INTERNVL3_BASELINES["Monolith"]), GPUS)
    warmup = args.requests // 10
    result: dict = {"capacity": {}, "latency": {}}
    with Server(model, GPUS, plan_for=requests, speedup=args.speedup) as server:
        planned = server.planned()
        overload = retime(requests, args.load * planned.throughput * args.speedup)
        common = retime(requests, args.latency_load * monolith.throughput * args.speedup)
        rate = args.latency_load * monolith.throughput
        print(f"{panel}: capacity runs, then latency runs at {rate:.3f} req/s (A100 scale)", flush=True)
        plans = {"prismserve": (planned, True), "Monolith": (monolith, False)}
        for label, (plan, deployed) in plans.items():
            run = measure(server, label, plan, overload, args.speedup, warmup, deployed)
            result["capacity"][label] = run.to_json()
            slow = measure(server, label, plan, common, args.speedup, warmup, deployed=True)  # still up
            result["latency"][label] = {
                "summary": slow.summary,
                "latencies_s": sorted(r.latency_s * args.speedup for r in slow.results if r.ok),
            }
    result["workload"] = describe_workload(requests)
    result["throughput_ratio"] = (
        result["capacity"]["prismserve"]["measured_rps"] / result["capacity"]["Monolith"]["measured_rps"]
    )
    result["latency_rate_rps"] = args.latency_load * monolith.throughput
    return result


def percentile(values: list[float], p: float) -> float:
    """The `p`-th percentile of sorted `values` (nearest rank)."""
    return values[min(len(values) - 1, max(0, round(p / 100 * len(values)) - 1))]


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    """README rows: monolith / plan latency at P50, P90, P99 per panel (the paper plots only), and 11b's throughput."""
    data = load(results, NAME)
    if not data:
        return []
    out = []
    for panel, result in data["panels"].items():
        mono, plan = (
            result["latency"]["Monolith"]["latencies_s"],
            result["latency"]["prismserve"]["latencies_s"],
        )
        ratios = ", ".join(f"P{p} {percentile(mono, p) / percentile(plan, p):.2f}x" for p in (50, 90, 99))
        out.append(
            (
                f"Fig {panel}: InternVL3, 16 GPUs, monolith / plan latency",
                "plot only (plan's curve better)",
                ratios,
                "-",
                f"both at {result['latency_rate_rps']:.2f} req/s (0.9x the monolith's capacity); no KV-cache "
                "preemption is emulated (the paper's reason for the monolith's curve), and each extra hop "
                "of the plan's paths adds a batch wait",
            )
        )
        ratio = result["throughput_ratio"]
        paper = f"{PAPER_11B_THROUGHPUT}x" if panel.startswith("11b") else "-"
        out.append(
            (
                f"Fig {panel}: InternVL3, 16 GPUs, plan / monolith throughput",
                paper,
                f"{ratio:.2f}x",
                f"{ratio / PAPER_11B_THROUGHPUT:.2f}" if panel.startswith("11b") else "-",
                f"predicted {result['capacity']['prismserve']['predicted_rps']:.3f} vs "
                f"{result['capacity']['Monolith']['predicted_rps']:.3f} req/s",
            )
        )
    return out


def details(results: Path) -> str:
    """Markdown: per panel and deployment, capacity (predicted, measured) and latency percentiles."""
    data = load(results, NAME)
    if not data:
        return ""
    lines = [
        "| panel | deployment | predicted req/s | measured req/s | P50 s | P90 s | P99 s |",
        "|---|---|---|---|---|---|---|",
    ]
    for panel, result in data["panels"].items():
        for label, run in result["capacity"].items():
            lat = result["latency"][label]["latencies_s"]
            cells = " | ".join(f"{percentile(lat, p):.1f}" for p in (50, 90, 99))
            lines.append(
                f"| {panel} | {label} | {run['predicted_rps']:.3f} | {run['measured_rps']:.3f} | {cells} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
