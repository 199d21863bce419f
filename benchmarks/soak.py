"""Soak: the tiny Qwen2.5-Omni served as `prismserve serve MODEL --fake-gpus 8 --gpus all` plans it,
under open-loop load at 70 % of the plan's predicted capacity for `--minutes`; with `--emulated
NAME`, a paper-scale model on `sim` executors instead (`prismserve.emulate`, e.g. qwen25-omni),
planned the same way (the server profiles its sim replicas), its costs sped up `--speedup` times.

The workload is the any-to-any mix of `bench_plan_loop.py` (images, audio in half the requests,
speech out in a fifth), Poisson arrivals, in rounds of `--round-s` seconds sent back to back; after
each round the server's processes are sampled. Reported, and checked: no request lost (every one
answered 200), memory of the gateway (the serve process) and of the replicas (each replica's
process and those under it: its engine), after warm-up (the first fifth of the rounds, at least
one: the engines' memory grows for their first minutes) and at the end, growth below 10 %; the server's shared-memory slabs in /dev/shm (or leaked ones) and the gateway's open file descriptors
no more at the end than after warm-up.
Run: python benchmarks/soak.py [--minutes 30] [--load 0.7] [--round-s 60] [--emulated qwen25-omni]
     [--speedup 1] [--profile-cache DIR] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from bench_plan_loop import serve, stop, workload

import prismserve  # noqa: F401  (telemetry off)
from prismserve.bench.loadgen import run_load
from prismserve.bench.workloads import RequestSpec, poisson_times, write_requests
from prismserve.emulate.app import app_source
from prismserve.models import tiny
from prismserve.runtime.dataplane import SHM_DIR, SLAB_PREFIX

GROWTH_LIMIT = 0.10
REPLICA = "ray::ExecutorReplica"  # a replica actor's process name


def sample(pid: int) -> dict[str, float]:
    """Memory (MiB) of the gateway and of the replicas (their processes and every process under
    them: engines), the gateway's open files, its slabs. Ray's own processes and idle workers,
    which come and go, are not counted."""
    gateway = psutil.Process(pid)
    rss = 0
    under = gateway.children(recursive=True)
    for process in under:
        with contextlib.suppress(psutil.Error):  # ended between the listing and the read
            if process.name().startswith(REPLICA):
                rss += sum(p.memory_info().rss for p in (process, *process.children(recursive=True)))
    return {
        "gateway_mib": gateway.memory_info().rss / 2**20,
        "replicas_mib": rss / 2**20,
        "gateway_fds": gateway.num_fds(),
        "slabs": slabs({pid, *(p.pid for p in under)}),
    }


def slabs(ours: set[int]) -> int:
    """Slabs in /dev/shm of processes in `ours` or of none alive (a leak): another server's on the
    machine are not counted. A slab's name holds its owner's pid (`dataplane.Slab`)."""
    count = 0
    for path in glob.glob(f"{SHM_DIR}/{SLAB_PREFIX}*"):
        owner = Path(path).name[len(SLAB_PREFIX) :].split("-", 1)[0]
        count += owner.isdigit() and (int(owner) in ours or not psutil.pid_exists(int(owner)))
    return count


def start(args: argparse.Namespace, files: Path) -> tuple[subprocess.Popen[str], str, float, str]:
    """Serve the tiny Omni, or `args.emulated` on sim executors, as `--gpus all` plans it for the
    any-to-any mix: the server, its URL, the plan's predicted req/s and the served model's name."""
    if args.emulated:  # an app file on sim executors, served under its file's stem
        os.environ["PRISMSERVE_SIM_SPEEDUP"] = str(args.speedup)
        target, name = files / f"{args.emulated}.py", args.emulated
        target.write_text(app_source(args.emulated))
    else:
        target = tiny.build("qwen2.5-omni")
        name = target.name
    write_requests(workload(200, 1), files / "workload.jsonl")
    cache = args.profile_cache or files / "profiles"
    return (*serve(target, 8, files / "workload.jsonl", cache), name)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `start`'s server."""
    parser.add_argument("--emulated", help="a paper-scale model on sim executors (prismserve.emulate)")
    parser.add_argument("--speedup", type=float, default=1.0, help="with --emulated: its costs sped up")
    parser.add_argument(
        "--profile-cache",
        type=Path,
        help="the server's profile cache: a run finds the profile an earlier one measured there "
        "(default: a new folder, so every run profiles and plans anew)",
    )


def soak(args: argparse.Namespace) -> dict:
    rounds = max(2, round(args.minutes * 60 / args.round_s))
    with tempfile.TemporaryDirectory(prefix="prismserve-soak-") as folder:
        process, url, predicted, name = start(args, Path(folder))
        rate = args.load * predicted
        rng = np.random.default_rng(args.seed)
        samples, results = [], []
        try:
            for index in range(rounds):
                count = max(1, round(rate * args.round_s))
                specs = workload(count, args.seed + 10 + index)
                times = poisson_times(rng, rate, count, None)
                timed = [
                    RequestSpec(**{**vars(s), "arrival_s": float(t)})
                    for s, t in zip(specs, times, strict=True)
                ]
                started = time.perf_counter()
                done = asyncio.run(run_load(url, name, timed, progress=False))
                results += done
                samples.append(
                    {"round": index, "seconds": time.perf_counter() - started, **sample(process.pid)}
                )
                failed = sum(not r.ok for r in done)
                print(
                    f"  round {index + 1}/{rounds}: {len(done)} requests, {failed} failed, {samples[-1]}",
                    flush=True,
                )
        finally:
            stop(process)
    warm, end = samples[max(1, rounds // 5) - 1], samples[-1]
    lost = [r.error or f"HTTP {r.status}" for r in results if not r.ok]
    report = {
        "model": f"emulated {args.emulated} (x{args.speedup:g})" if args.emulated else "tiny qwen2.5-omni",
        "predicted_rps": predicted,
        "offered_rps": rate,
        "minutes": sum(s["seconds"] for s in samples) / 60,
        "requests": len(results),
        "lost": len(lost),
        "errors": sorted(set(lost))[:5],
        "gateway_growth": end["gateway_mib"] / warm["gateway_mib"] - 1,
        "replicas_growth": end["replicas_mib"] / warm["replicas_mib"] - 1,
        "slabs": (warm["slabs"], end["slabs"]),
        "gateway_fds": (warm["gateway_fds"], end["gateway_fds"]),
        "samples": samples,
    }
    report["passed"] = (
        not lost
        and report["gateway_growth"] < GROWTH_LIMIT
        and report["replicas_growth"] < GROWTH_LIMIT
        and end["slabs"] <= warm["slabs"]
        and end["gateway_fds"] <= warm["gateway_fds"]
    )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--load", type=float, default=0.7, help="arrival rate / the plan's predicted capacity"
    )
    parser.add_argument("--round-s", type=float, default=60.0, help="seconds of load between samples")
    add_server_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    random.seed(args.seed)
    report = soak(args)
    finish(
        report,
        args.out,
        f"{report['requests']} requests over {report['minutes']:.1f} min at {report['offered_rps']:.2f} req/s "
        f"({args.load:g} x predicted {report['predicted_rps']:.2f}): lost {report['lost']}, gateway memory "
        f"{report['gateway_growth']:+.1%}, replicas {report['replicas_growth']:+.1%}, slabs {report['slabs']}, "
        f"gateway fds {report['gateway_fds']}",
    )


def finish(report: dict, out: Path | None, summary: str) -> None:
    """Print `summary` and the verdict, write the report to `out`, exit 0 if it passed."""
    print(f"{summary}: {'passed' if report['passed'] else 'FAILED'}")
    if out:
        out.write_text(json.dumps(report, indent=1))
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
