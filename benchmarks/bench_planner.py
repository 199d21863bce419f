"""Planner speed on a Qwen-Omni-sized spec (6 components, 14 executors, 8 request types).

  cells up to 64 GPUs     Algorithm 1: one max-throughput MILP (plus a fewest-GPU MILP) per size 1..64
  mixture, 100,000 GPUs   binary decomposition of a 100,000-GPU budget over those cells
  mixture, target rate    exact fewest-GPU mixture for the rate 100,000 GPUs reach
Run: python benchmarks/bench_planner.py [--spec docs/examples/qwen25_omni.yaml] [--repeats 5] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from prismserve.planner import build_model, load_spec, mixture_for_budget, mixture_for_target, mixture_throughput, plan_cells

DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "docs" / "examples" / "qwen25_omni.yaml"


def timed(function, repeats: int) -> tuple[float, object]:
    samples, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=str(DEFAULT_SPEC))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    model = build_model(spec)
    cells_s, cells = timed(lambda: plan_cells(build_model(spec), 6), args.repeats)
    budget_s, mix = timed(lambda: mixture_for_budget(cells, 100_000), max(args.repeats, 200))
    rate = mixture_throughput(cells, mix)
    target_s, target_mix = timed(lambda: mixture_for_target(cells, rate), max(args.repeats, 200))
    results = {
        "spec": {"components": len(spec.components), "executors": len(spec.executors), "request_types": len(spec.request_types),
                 "paths": sum(len(p) for p in model.paths.values())},
        "cells": [{"gpus": c.gpus, "throughput": c.throughput} for c in cells],
        "plan_cells_up_to_64_gpus_s": cells_s,
        "mixture_for_budget_100000_gpus_ms": budget_s * 1e3,
        "mixture_for_target_ms": target_s * 1e3,
        "target_rps": rate,
        "target_mixture_gpus": sum(g * n for g, n in target_mix.items()),
    }
    s = results["spec"]
    print(f"spec: {s['components']} components, {s['executors']} executors, {s['request_types']} request types, {s['paths']} paths")
    print("efficient cells: " + ", ".join(f"{c['gpus']} GPUs {c['throughput']:.2f} req/s" for c in results["cells"]))
    print(f"{'plan all cells up to 64 GPUs':<36} {cells_s * 1e3:>10.1f} ms   (target < 1000 ms)")
    print(f"{'mixture for a 100,000-GPU budget':<36} {budget_s * 1e3:>10.3f} ms   (target < 10 ms)")
    print(f"{'mixture for {:.0f} req/s'.format(rate):<36} {target_s * 1e3:>10.3f} ms   ({results['target_mixture_gpus']} GPUs)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
