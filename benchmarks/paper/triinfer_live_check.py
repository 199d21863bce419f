"""The trace replay checked against the live `sim` executors: one layout, one workload, both ways.

A real `prismserve serve` (gateway, Ray, sim executors on declared GPUs) serves the emulated
LLaVA-1.5-7B on an EP+D plan; the load generator sends TextCaps-shaped requests over HTTP above the
plan's capacity, and the gateway records the trace (`--record-trace`). The same requests are then
replayed by `planner.replay` on the same layout. Compared: sustained throughput (the completion rate
between ramp-up and ramp-down, H20 scale) live, in the replay, and the emulation's exact capacity
(`EmulatedModel.capacity`); and the recorded trace against what was sent.

What must agree and what need not: both sides take their work from `Llava15Costs` (the replay from
its per-iteration latencies, the sim from the full-batch work they imply), so throughput at
overload should agree; latencies need not — the sim executors share a replica among up to 8
requests (processor sharing), the replay runs Algorithm 1's budgeted iterations.
Run: python benchmarks/paper/triinfer_live_check.py [--requests 400] [--speedup 0.1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
from harness import RESULTS, Server, measure, plan_for, retime, write
from triinfer import workload

from prismserve.bench.workloads import RequestSpec
from prismserve.emulate import LLAVA15
from prismserve.planner.replay import Replay, layout_name, read_trace, scaled

GPUS = 8  # the app starts with one replica of each of its 7 one-GPU options
IMAGE = (336, 336)


def steady_rate(done: list[float], edge: int) -> float:
    """Completions per second between the `edge`-th first and last completion (harness's `steady_rps`)."""
    done = sorted(done)
    first, last = done[edge], done[len(done) - 1 - edge]
    return (len(done) - 1 - 2 * edge) / (last - first)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument(
        "--speedup", type=float, default=0.1, help="sim time divisor (default 0.1: 10x slower)"
    )
    parser.add_argument("--load", type=float, default=1.3, help="arrival rate / the plan's exact capacity")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    trace = workload("TextCaps", args.requests, args.seed, "poisson")
    specs = [RequestSpec(r.arrival_s, r.text_tokens, r.output_tokens, images=(IMAGE,)) for r in trace]
    spec = LLAVA15.restricted(LLAVA15.planner_spec(specs), ["EP", "D"])
    plan = plan_for(spec, GPUS)
    layout: dict[str, int] = {}
    for cell in plan.cells:
        for name, n in cell.replicas.items():
            layout[name] = layout.get(name, 0) + n * cell.count
    exact = LLAVA15.capacity(layout, plan.routing, specs)
    rate = args.load * exact
    sent = retime(specs, rate * args.speedup)
    warmup = max(10, args.requests // 10)
    with tempfile.TemporaryDirectory() as folder:
        recorded_path = Path(folder) / "trace.jsonl"
        with Server(LLAVA15, GPUS, extra=("--record-trace", str(recorded_path))) as server:
            live = measure(server, layout_name(layout), plan, sent, args.speedup, warmup)
        recorded = read_trace(recorded_path)

    costs = LLAVA15.costs.stage_costs()
    assert costs is not None
    jobs = Replay(layout, costs).run(scaled(trace, rate))
    replayed = steady_rate([j.times["done"] for j in jobs], warmup)
    replay_latency = [j.times["done"] - j.arrival for j in jobs]
    live_latency = [r.latency_s * args.speedup for r in live.results if r.ok]
    result = {
        "layout": layout_name(layout),
        "requests": args.requests,
        "speedup": args.speedup,
        "arrival_rate": rate,
        "exact_capacity_rps": exact,
        "live_rps": live.measured_rps,
        "replay_rps": replayed,
        "replay_over_live": replayed / live.measured_rps,
        "live_over_exact": live.measured_rps / exact,
        "replay_over_exact": replayed / exact,
        "live_failed": live.summary["failed"],
        "latency_s": {
            "live_p50": float(np.percentile(live_latency, 50)),
            "replay_p50": float(np.percentile(replay_latency, 50)),
            "live_mean": statistics.fmean(live_latency),
            "replay_mean": statistics.fmean(replay_latency),
        },
        "recorded_trace": {
            "lines": len(recorded),
            "sent": len(sent),
            "images_per_request": sorted({r.images for r in recorded}),
            "text_tokens_match": sorted(r.text_tokens for r in recorded)
            == sorted(s.text_tokens for s in sent),
            "output_tokens_match": sorted(r.output_tokens for r in recorded)
            == sorted(s.output_tokens for s in sent),
        },
    }
    print(
        f"{result['layout']}: exact capacity {exact:.2f} req/s (H20 scale), live {live.measured_rps:.2f} "
        f"({result['live_over_exact']:.2f} of exact), replay {replayed:.2f} ({result['replay_over_exact']:.2f}); "
        f"replay/live {result['replay_over_live']:.2f}"
    )
    print(f"latency (H20 s): {result['latency_s']}")
    print(f"recorded trace: {result['recorded_trace']}")
    print(f"wrote {write(f'triinfer_live_check_seed{args.seed}', result, RESULTS)}")


if __name__ == "__main__":
    main()
