"""Planner speed on a Qwen-Omni-sized spec (6 components, 14 options, 8 request types).

  plan all cells up to 64 GPUs   Algorithm 1: build the model, one max-throughput MILP (and a
                                 fewest-GPU check) per size 1, 2, …, 64, the efficiency filter
  mixture for 100,000 GPUs       binary decomposition of a 100,000-GPU budget over those cells
  mixture for a target rate      exact fewest-GPU mixture for the rate 100,000 GPUs reach
  greedy (paper's Algorithm 2)   the baseline, for comparison

Targets (the planner issue): cells < 1 s, mixture at 100,000 GPUs < 10 ms. Medians over --repeats.
Run: python benchmarks/bench_planner.py [--spec docs/examples/qwen25_omni.yaml] [--repeats 7] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from prismserve.planner import (  # noqa: E402
    build_model,
    greedy_mixture,
    load_spec,
    mixture_for_budget,
    mixture_for_target,
    mixture_throughput,
    plan_cells,
)

DEFAULT_SPEC = ROOT / "docs" / "examples" / "qwen25_omni.yaml"
GPUS = 100_000


def timed(function, repeats: int) -> tuple[float, object]:
    """Median seconds of `repeats` calls, and the last result."""
    samples, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--spec", default=str(DEFAULT_SPEC), help="plan spec (default: the Qwen2.5-Omni example)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="runs per measurement for cells (default 7)")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()

    spec = load_spec(args.spec)
    model = build_model(spec)
    plan_cells(model, 6)  # warm-up: imports HiGHS and pages in its code
    cells_s, cells = timed(lambda: plan_cells(build_model(spec), 6), args.repeats)
    fast = max(args.repeats, 200)
    budget_s, mix = timed(lambda: mixture_for_budget(cells, GPUS), fast)
    rate = mixture_throughput(cells, mix)
    target_s, target_mix = timed(lambda: mixture_for_target(cells, rate), fast)
    greedy_s, greedy_mix = timed(lambda: greedy_mixture(cells, rate), max(args.repeats, 20))

    results = {
        "spec": {
            "file": str(
                Path(args.spec).resolve().relative_to(ROOT)
                if Path(args.spec).resolve().is_relative_to(ROOT)
                else args.spec
            ),
            "components": len(spec.components),
            "options": len(spec.options),
            "request_types": len(spec.request_types),
            "valid_paths": sum(len(p) for p in model.paths.values()),
            "hops": sum(len(g.hops) for g in model.graphs.values()),
        },
        "machine": {"python": platform.python_version(), "processor": platform.machine(), "cpus": _cpus()},
        "repeats": args.repeats,
        "cells": [{"gpus": c.gpus, "throughput": c.throughput} for c in cells],
        "plan_cells_up_to_64_gpus_ms": cells_s * 1e3,
        "mixture_for_budget_100000_gpus_ms": budget_s * 1e3,
        "mixture_for_target_ms": target_s * 1e3,
        "greedy_mixture_ms": greedy_s * 1e3,
        "target_rps": rate,
        "target_mixture_gpus": sum(g * n for g, n in target_mix.items()),
        "greedy_mixture_gpus": sum(g * n for g, n in greedy_mix.items()),
    }
    s = results["spec"]
    print(
        f"spec {s['file']}: {s['components']} components, {s['options']} options, {s['request_types']} request types, "
        f"{s['valid_paths']} valid paths ({s['hops']} hops in the MILP)"
    )
    print(
        "efficient cells: "
        + ", ".join(f"{c['gpus']} GPUs {c['throughput']:.2f} req/s" for c in results["cells"])
    )
    print()
    print(f"{'measurement':<40} {'median':>12}   target")
    print(f"{'plan all cells up to 64 GPUs':<40} {cells_s * 1e3:>9.1f} ms   < 1000 ms")
    print(f"{'mixture for a 100,000-GPU budget':<40} {budget_s * 1e3:>9.3f} ms   < 10 ms")
    print(
        f"{f'mixture for {rate:,.0f} req/s (exact)':<40} {target_s * 1e3:>9.3f} ms   < 10 ms   -> {results['target_mixture_gpus']:,} GPUs"
    )
    print(
        f"{'same target, greedy (paper Alg. 2)':<40} {greedy_s * 1e3:>9.3f} ms             -> {results['greedy_mixture_gpus']:,} GPUs"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {args.out}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


if __name__ == "__main__":
    main()
