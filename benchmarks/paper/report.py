"""Print the benchmarks/README.md tables from the reproductions' JSON results (benchmarks/results):
what `prismserve bench paper --tables-only` writes into the README; `--fig10` sets runs side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness import RESULTS

from prismserve.bench.paper import tables


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
    for name, block in tables(Path(__file__).resolve().parents[2], args.results).items():
        print(block if name == "rows" else f"\n{name}\n\n{block}")


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
