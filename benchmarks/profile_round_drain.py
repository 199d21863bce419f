"""What a profile round's drain would cost a continuous-batching option, computed on the emulation.

The shaped profiler (`prismserve/profile/shaped.py`) times a path on one round of `batch` requests
of one type started together, and reads a replica's seconds per request as its busy time over
the round's requests. With the workload's own outputs (as it did before
`prismserve.profile.requests.profile_requests` gave a round's requests the type's mean output), a
continuous batcher's batch is full only until the round's shortest request ends; the rest of the
round runs at a partial batch, slower per request. This computes, per continuous option of an
emulated model, the rate such rounds would measure over the option's full-batch rate, if every
request's inputs were there at the round's start: each request's work on the option from the
emulation's costs, served by the `sim` batcher's processor sharing (`SharedEngine`: each of n
running requests at 1 / (1 + growth (n - 1)) of its batch-1 speed). Compare with
`bench_profile_emulated.py`, which measures the rates on replicas.
Run: python benchmarks/profile_round_drain.py [--model qwen25-omni] [--requests 2000] [--seed 0]
     [--batch 8] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def busy_seconds(works: list[float], growth: float) -> float:
    """Seconds a processor-sharing batcher is busy serving `works` (batch-1 seconds) started together."""
    left, elapsed = sorted(works), 0.0
    while left:
        rate = 1.0 / (1.0 + growth * (len(left) - 1))
        elapsed += left[0] / rate
        left = [w - left[0] for w in left[1:]]
    return elapsed


def drained_rates(model_name: str, requests: int, seed: int, batch: int) -> dict[str, dict[str, float]]:
    """Continuous option -> the rate a round of `batch` requests measures over its full-batch rate,
    over the workload's mix: on the round the profiler times (a type's requests `batch` to
    `2 batch - 1`, see `shaped._examples`), and on average over every round of consecutive
    requests. Each round's own mean work is divided out: what is left is the drain alone, not
    which requests the round drew."""
    from prismserve.bench.workloads import Arrivals, servegen
    from prismserve.emulate.catalog import MODELS

    model = MODELS[model_name]
    specs = servegen(
        Arrivals("poisson", 1.0), count=requests, any_to_any=model_name == "qwen25-omni", seed=seed
    )
    out = {}
    for option in (o for o in model.options if o.continuous and o.max_batch > 1):
        growth = option.profile(1.0).batch_growth
        by_type: dict[tuple[tuple[str, ...], bool], list[float]] = defaultdict(list)
        for spec in specs:
            needs = model.costs.needs(spec)
            role = [c for c in option.components if c in needs]
            if role:  # batch-1 seconds of the option's work for the request
                by_type[needs, spec.audio_out].append(
                    option.seconds(model.costs.work(spec), role) * option.batch_gain
                )
        full = profiled = every = 0.0  # seconds per request of the mix: at full batch, as measured
        for works in by_type.values():
            mean, share = sum(works) / len(works), len(works) / len(specs)
            full += share * mean / option.batch_gain
            profiled += share * mean * _drain(works[batch : 2 * batch] or works, growth)
            rounds = [works[i : i + batch] for i in range(0, len(works) - batch + 1, batch)] or [works]
            every += share * mean * sum(_drain(r, growth) for r in rounds) / len(rounds)
        out[option.name] = {"profiled_round": full / profiled, "every_round": full / every}
    return out


def _drain(works: list[float], growth: float) -> float:
    """Busy seconds per request of a round, per second of its mean batch-1 work."""
    return busy_seconds(works, growth) / sum(works)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="qwen25-omni")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="workload seed (the paper scripts: 0)")
    parser.add_argument("--batch", type=int, default=8, help="requests per round (the profile's)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    rates = drained_rates(args.model, args.requests, args.seed, args.batch)
    print(
        f"{args.model}: a round of {args.batch} requests started together measures, of the full-batch rate:"
    )
    print(f"  {'option':<10} {'the profiled round':>18} {'every round':>12}")
    for name, row in rates.items():
        print(f"  {name:<10} {row['profiled_round']:>18.2f} {row['every_round']:>12.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"model": args.model, "batch": args.batch, "requests": args.requests, "rates": rates},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
