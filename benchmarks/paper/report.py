"""Print the benchmarks/README.md tables from the reproductions' JSON results (benchmarks/results)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness import RESULTS


def load(folder: Path, name: str) -> dict | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--fig10",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="print only the Figure 10 table, one column group per folder's fig10_internvl3.json (runs side by side)",
    )
    args = parser.parse_args()
    if args.fig10:
        fig10_table([load(folder, "fig10_internvl3") or {} for folder in args.fig10])
        return
    folder = args.results
    rows = []  # (experiment, paper, ours, ours / paper)
    accuracy = []  # (experiment, deployment, predicted, measured, ratio)
    omni = load(folder, "fig6a_table2_omni")
    if omni:
        for gpus, cell in omni["cells"].items():
            paper, ours = cell["paper_speedup_over_monolith"], cell["speedup_over_monolith"]
            rows.append(
                (
                    f"Fig 6a: Qwen2.5-Omni, {gpus} GPUs, plan / monolith throughput",
                    f"{paper:.2f}x",
                    f"{ours:.2f}x (predicted {cell['predicted_speedup_over_monolith']:.2f}x)",
                    f"{ours / paper:.2f}",
                )
            )
            for label, run in cell["runs"].items():
                accuracy.append(
                    (f"Fig 6a {gpus} GPUs", label, run["predicted_rps"], run["measured_rps"], run["accuracy"])
                )
        if "cells" in omni and "16" in omni["cells"]:
            runs = omni["cells"]["16"]["runs"]
            for p, paper in (("p50", 3.24), ("p95", 5.3), ("p99", 5.79)):
                ours = (
                    runs["Monolith"]["summary"]["latency_s"][p]
                    / runs["prismserve"]["summary"]["latency_s"][p]
                )
                rows.append(
                    (
                        f"Fig 8a / Table 2: 16 GPUs, monolith / plan {p.upper()} latency",
                        f"{paper}x",
                        f"{ours:.2f}x",
                        f"{ours / paper:.2f}",
                    )
                )
    internvl = load(folder, "fig10_internvl3")
    if internvl:
        for name, result in internvl["workloads"].items():
            paper = "> 1 (E + EPD mixture)" if name == "Less text" else "≈ 1 (matches the best)"
            rows.append(
                (
                    f"Fig 10: InternVL3, {name}, plan / best baseline ({result['best_baseline']})",
                    paper,
                    f"{result['plan_over_best_baseline']:.2f}x",
                    "-",
                )
            )
            for label, run in result["runs"].items():
                accuracy.append(
                    (f"Fig 10 {name}", label, run["predicted_rps"], run["measured_rps"], run["accuracy"])
                )
    routing = load(folder, "sec74_routing")
    if routing:
        if "static_over_dynamic" in routing:  # a run of both (`--quick` runs static and path only)
            ours, paper = routing["static_over_dynamic"], routing["paper"]["ratio"]
            rows.append(
                (
                    "§7.4: static / dynamic routing throughput",
                    f"{paper}x",
                    f"{ours:.2f}x",
                    f"{ours / paper:.2f}",
                )
            )
        for label, run in routing["runs"].items():
            accuracy.append(("§7.4", label, run["predicted_rps"], run["measured_rps"], run["accuracy"]))

    print("| experiment | paper | ours | ours / paper |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        "\n| run | deployment | predicted req/s | measured req/s | achieved / predicted |\n|---|---|---|---|---|"
    )
    for run, label, predicted, measured, ratio in accuracy:
        print(f"| {run} | {label} | {predicted:.3f} | {measured:.3f} | {ratio:.2f} |")
    if omni and "table2" in omni:
        print("\nTable 2 (16 GPUs, seconds at A100 scale; paper in brackets)\n")
        print("| type | monolith P50 | P90 | P99 | plan P50 | P90 | P99 |\n|---|---|---|---|---|---|---|")
        for name, row in sorted(omni["table2"].items()):
            mono, ours, paper = row["Monolith"], row["prismserve"], row["paper"]
            cells = [f"{mono[p]:.1f} ({paper['mono_' + p]})" for p in ("p50", "p90", "p99")]
            cells += [f"{ours[p]:.1f} ({paper['ours_' + p]})" for p in ("p50", "p90", "p99")]
            print(f"| {name} | " + " | ".join(cells) + " |")


def fig10_table(runs: list[dict]) -> None:
    """Figure 10 per workload and deployment: the prediction, and each run's measurement with
    measured / predicted; then the planner's plan over the best baseline in each run."""
    head = " | ".join(f"run {i + 1}: measured (/ predicted)" for i in range(len(runs)))
    print(f"| workload | deployment | predicted | {head} |\n|---|---|---|" + "---|" * len(runs))
    for name in runs[0].get("workloads", {}):
        for label, first in runs[0]["workloads"][name]["runs"].items():
            cells = []
            for run in runs:
                r = run["workloads"][name]["runs"][label]
                other = (
                    ""
                    if abs(r["predicted_rps"] - first["predicted_rps"]) < 1e-6
                    else f", predicted {r['predicted_rps']:.3f}"
                )
                cells.append(f"{r['measured_rps']:.3f} ({r['accuracy']:.2f}{other})")
            print(f"| {name} | {label} | {first['predicted_rps']:.3f} | " + " | ".join(cells) + " |")
        ratios = " | ".join(
            f"**{run['workloads'][name]['plan_over_best_baseline']:.3f}x** ({run['workloads'][name]['best_baseline']})"
            for run in runs
        )
        print(f"| {name} | plan / best baseline | | {ratios} |")


if __name__ == "__main__":
    main()
