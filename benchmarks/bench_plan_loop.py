"""The plan loop on a real model: `prismserve serve MODEL --fake-gpus 8 --gpus all` profiles the tiny
Qwen2.5-Omni on this machine, plans for its 8 declared GPUs and serves; the throughput it reaches is
compared with the plan's prediction, in the same run.

Workload: the any-to-any recipe of the Cornserve paper (§7.2 footnote 6: at least one image, audio in
half the requests, speech out in a fifth) at sizes a tiny model's context holds (images of 112-224
pixels, 8-32 words in, 8-24 tokens out), as a workload file the server profiles and plans for
(`--profile-workload`). Each run starts the server (the first one measures the profile; later ones
read it from the cache, as a restarted server does), sends `--requests` at `--load` x the predicted
rate (Poisson, open loop) and reports the completion rate between ramp-up and ramp-down.
Run: python benchmarks/bench_plan_loop.py [--runs 2] [--requests 160] [--load 1.25] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import prismserve  # noqa: F401  (telemetry off)
from prismserve.bench.loadgen import run_load
from prismserve.bench.metrics import summarize
from prismserve.bench.workloads import RequestSpec, poisson_times, write_requests
from prismserve.models import tiny

PLANNED = re.compile(r"planned '(?P<name>[^']+)' for (?P<gpus>\d+) GPUs: (?P<rps>[0-9.e+-]+) req/s predicted")


def workload(count: int, seed: int) -> list[RequestSpec]:
    """The any-to-any mix at tiny sizes (arrival times set later)."""
    rng = random.Random(seed)
    return [
        RequestSpec(
            0.0,
            text_tokens=rng.randint(8, 32),
            output_tokens=rng.randint(8, 24),
            images=tuple((side, side) for side in rng.choices([112, 168, 224], k=rng.choice([1, 1, 2]))),
            audios=int(rng.random() < 0.5),
            audio_out=rng.random() < 0.2,
        )
        for _ in range(count)
    ]


def serve(
    model: Path, gpus: int, profile_workload: Path, cache: Path
) -> tuple[subprocess.Popen[str], str, float]:
    """Start the server; returns it, its URL and the plan's predicted req/s once it serves."""
    env = {**os.environ, "PRISMSERVE_PROFILE_CACHE": str(cache)}
    command = [
        sys.executable, "-m", "prismserve", "serve", str(model), "--offline", "--port", "0",
        "--fake-gpus", str(gpus), "--gpus", "all", "--profile-workload", str(profile_workload), "--no-replan",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    predicted = None
    assert process.stdout is not None
    for line in process.stdout:
        found = PLANNED.search(line)
        if found:
            predicted = float(found["rps"])
            print("  " + line.strip(), flush=True)
        if "serving app" in line:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # keep the pipe drained
            if predicted is None:
                break
            return process, line.rsplit(" at ", 1)[1].strip(), predicted
    process.kill()
    raise RuntimeError(f"the server did not plan and start (exit {process.wait()})")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def one_run(args: argparse.Namespace, model: Path, specs: list[RequestSpec], files: Path) -> dict:
    cache = args.profile_cache or files / "profiles"
    process, url, predicted = serve(model, args.gpus, files / "workload.jsonl", cache)
    try:
        rate = args.load * predicted
        times = poisson_times(np.random.default_rng(args.seed), rate, len(specs), None)
        timed = [RequestSpec(**{**vars(s), "arrival_s": float(t)}) for s, t in zip(specs, times, strict=True)]
        started = time.perf_counter()
        results = asyncio.run(run_load(url, model.name, timed, progress=sys.stderr.isatty()))
        summary = summarize(results, args.requests // 10)
    finally:
        stop(process)
    measured = summary["steady_rps"]
    print(
        f"  offered {rate:.2f} req/s for {time.perf_counter() - started:.0f} s: measured {measured:.3f} req/s, "
        f"predicted {predicted:.3f}, measured/predicted {measured / predicted:.2f}, failed {summary['failed']}",
        flush=True,
    )
    return {
        "predicted_rps": predicted,
        "measured_rps": measured,
        "ratio": measured / predicted,
        "summary": summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--load", type=float, default=1.25, help="arrival rate / predicted throughput")
    parser.add_argument("--gpus", type=int, default=8, help="declared GPUs, all planned for (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile-cache",
        type=Path,
        help="the server's profile cache (default: a new folder: the first run measures the profile)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    model = tiny.build("qwen2.5-omni")
    specs = workload(args.requests, args.seed)
    runs = []
    with tempfile.TemporaryDirectory(prefix="prismserve-plan-loop-") as folder:
        files = Path(folder)
        write_requests(workload(200, args.seed + 1), files / "workload.jsonl")
        for index in range(args.runs):
            print(f"run {index + 1} of {args.runs}", flush=True)
            runs.append(one_run(args, model, specs, files))
    ratios = [r["ratio"] for r in runs]
    print(f"{'run':>4} {'predicted':>10} {'measured':>10} {'ratio':>6}")
    for index, r in enumerate(runs, 1):
        print(f"{index:>4} {r['predicted_rps']:>10.3f} {r['measured_rps']:>10.3f} {r['ratio']:>6.2f}")
    print(f"median measured/predicted: {statistics.median(ratios):.2f}")
    if args.out:
        args.out.write_text(
            json.dumps({"gpus": args.gpus, "requests": args.requests, "runs": runs}, indent=1)
        )


if __name__ == "__main__":
    main()
