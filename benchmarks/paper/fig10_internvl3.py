"""000 Figure 10: InternVL3-38B-like model on 16 GPUs, the controlled workloads of Table 3.

Deployments: Monolith (EPD on 2 GPUs), E/PD, EP/D, E/P/D — each with replica counts the planner
picks when limited to those options ("chosen to maximize throughput given the planner output",
000 §7.3) — and the planner's own plan over every option, which the server makes for itself at
start (`prismserve serve --gpus 16 --profile-workload`: profile -> plan -> serve, no plan posted; an
emulated app's costs are its profile). Poisson arrivals at `--load` x the plan's predicted
throughput, the same requests for every deployment of a workload. 1000 requests by default: in
shorter runs the stages of a multi-hop plan are still filling their batches for much of the
measured window (benchmarks/README.md, fig10_queueing.py).
Run: python benchmarks/paper/fig10_internvl3.py [--requests 1000] [--speedup 4] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from harness import Server, add_out_argument, describe_workload, measure, plan_for, retime, write  # noqa: E402

from prismserve.bench.plots import throughput_bars  # noqa: E402
from prismserve.bench.workloads import RequestSpec, controlled  # noqa: E402
from prismserve.emulate.catalog import INTERNVL3, INTERNVL3_BASELINES  # noqa: E402
from prismserve.emulate.model import EmulatedModel  # noqa: E402

TABLE3 = {  # name: resolution, expected images per request, input text tokens, output tokens
    "Lower resolution": ((1680, 1050), 1.0, 1000, 300),
    "Standard": ((1920, 1080), 1.0, 1000, 300),
    "Less text": ((1920, 1080), 1.0, 100, 100),
    "Fewer images": ((1920, 1080), 0.6, 100, 100),
}
GPUS = 16
NAME = "fig10_internvl3"


def main() -> None:
    run_figure(INTERNVL3, INTERNVL3_BASELINES, NAME, "InternVL3-like", __doc__ or "")


def run_figure(
    model: EmulatedModel, baselines: dict[str, tuple[str, ...]], name: str, title: str, doc: str
) -> None:
    """Figure 10 for one model: parse the command line, run every Table 3 workload, plot, write `name`.json."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--speedup", type=float, default=4.0, help="sim time divisor (default 4)")
    parser.add_argument("--load", type=float, default=1.25, help="arrival rate / plan's predicted throughput")
    parser.add_argument("--workloads", nargs="+", choices=list(TABLE3), default=list(TABLE3))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="a tiny run: Less text, 40 requests at speedup 50"
    )
    add_out_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.speedup, args.workloads = 40, 50.0, ["Less text"]
    out: dict = {
        "model": model.name,
        "gpus": GPUS,
        "requests": args.requests,
        "speedup": args.speedup,
        "workloads": {},
    }
    for workload in args.workloads:
        resolution, images, text_in, text_out = TABLE3[workload]
        requests = controlled(1.0, resolution, images, text_in, text_out, count=args.requests, seed=args.seed)
        out["workloads"][workload] = compare(model, baselines, workload, requests, GPUS, args)
    for workload, result in out["workloads"].items():
        runs = result["runs"]
        throughput_bars(
            {label: run["measured_rps"] for label, run in runs.items()},
            args.out / f"{name}_{workload.lower().replace(' ', '_')}.png",
            predicted={label: run["predicted_rps"] for label, run in runs.items()},
            title=f"{title}, {GPUS} GPUs, {workload} (req/s, A100 scale)",
        )
    print("wrote", write(name, out, args.out))
    print(f"{'workload':<18}" + "".join(f"{label:>12}" for label in [*baselines, "prismserve"]))
    for workload, result in out["workloads"].items():
        print(
            f"{workload:<18}"
            + "".join(
                f"{result['runs'][label]['measured_rps']:>12.3f}" for label in [*baselines, "prismserve"]
            )
        )


def compare(
    model: EmulatedModel,
    baselines: dict[str, tuple[str, ...]],
    workload: str,
    requests: list[RequestSpec],
    gpus: int,
    args: argparse.Namespace,
) -> dict:
    """The server's own plan and each baseline (replicas picked by the planner within its options),
    measured on the same requests at `args.load` x the plan's predicted throughput."""
    spec = model.planner_spec(requests)  # the run's own requests: the planner's representative dataset
    plans = {label: plan_for(model.restricted(spec, options), gpus) for label, options in baselines.items()}
    # The server plans itself for this workload at start (profile -> plan -> serve).
    with Server(model, gpus, plan_for=requests, speedup=args.speedup) as server:
        planned = server.planned()
        rate = args.load * planned.throughput * args.speedup
        specs = retime(requests, rate)
        print(
            f"{workload}: {len(specs)} requests at {rate:.1f} req/s (sim, speedup {args.speedup:g})",
            flush=True,
        )
        warmup = args.requests // 10
        ours = measure(server, "prismserve", planned, specs, args.speedup, warmup, deployed=True)
        runs = {
            label: measure(server, label, plan, specs, args.speedup, warmup) for label, plan in plans.items()
        }
    runs["prismserve"] = ours
    best = max((r for label, r in runs.items() if label != "prismserve"), key=lambda r: r.measured_rps)
    ratio = ours.measured_rps / best.measured_rps
    print(f"{workload}: prismserve / best baseline ({best.label}) = {ratio:.2f}x", flush=True)
    return {
        "workload": describe_workload(specs),
        "runs": {label: run.to_json() for label, run in runs.items()},
        "best_baseline": best.label,
        "plan_over_best_baseline": ratio,
    }


def load(results: Path, name: str) -> dict | None:
    """`name`.json from `results`, or None when that experiment has not run."""
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def rows_for(
    results: Path, name: str, label: str, paper: dict[str, str]
) -> list[tuple[str, str, str, str, str]]:
    """README rows: per workload, the plan over the best baseline against `paper`'s claim for it."""
    data = load(results, name)
    if not data:
        return []
    out = []
    for workload, result in data["workloads"].items():
        ratio = result["plan_over_best_baseline"]
        plan = result["runs"]["prismserve"]
        why = (
            f"predicted {plan['predicted_rps']:.3f} vs best baseline "
            f"{result['runs'][result['best_baseline']]['predicted_rps']:.3f} req/s; measured "
            f"{plan['measured_rps']:.3f} ({plan['accuracy']:.2f} of predicted)"
        )
        out.append(
            (
                f"Fig 10: {label}, {workload}, plan / best baseline ({result['best_baseline']})",
                paper.get(workload, "≈ 1 (matches the best)"),
                f"{ratio:.2f}x",
                "-",
                why,
            )
        )
    return out


def details_for(results: Path, name: str) -> str:
    """Markdown: per workload and deployment, replicas, predicted and measured req/s."""
    data = load(results, name)
    if not data:
        return ""
    lines = ["| workload | deployment | replicas | predicted req/s | measured req/s | measured / predicted |"]
    lines.append("|---|---|---|---|---|---|")
    for workload, result in data["workloads"].items():
        for label, run in result["runs"].items():
            replicas: dict[str, int] = {}
            for cell in run["plan"]["cells"]:
                for option, n in cell["replicas"].items():
                    replicas[option] = replicas.get(option, 0) + n * cell.get("count", 1)
            counts = " ".join(f"{n}{option}" for option, n in replicas.items() if n)
            lines.append(
                f"| {workload} | {label} | {counts} | {run['predicted_rps']:.3f} | "
                f"{run['measured_rps']:.3f} | {run['accuracy']:.2f} |"
            )
    return "\n".join(lines)


PAPER = {"Less text": "> 1 (E + EPD mixture)"}


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    return rows_for(results, NAME, "InternVL3", PAPER)


def details(results: Path) -> str:
    return details_for(results, NAME)


if __name__ == "__main__":
    main()
