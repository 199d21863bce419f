"""Faults under load, measured: a process of the server killed mid-load, what it cost and how long the
server took to recover.

The server is the soak's (`soak.py`): the tiny Qwen2.5-Omni, or `--emulated NAME` on sim executors,
as `--gpus all` plans it, under open-loop load at `--load` x the plan's predicted capacity for
`--seconds`. A third of the way in, the busiest replica (most requests in flight, from
`/admin/status`) is killed with SIGKILL (`--fault replica`: an OOM killer, a crash of its Ray
worker), or its engine process is (`--fault engine`: a vLLM EngineCore, where the replica has one).
Reported: the requests that failed and how (status, message), whether each was in flight on the
server when the kill came, the seconds until the killed replica was running again, and the median
latency before the kill and after recovery. Checked (exit 1 otherwise): every failed request was in
flight at the kill, each failure came as an answer of the server (an error status, or an error
event ending its stream; no dropped connection), and the replica ran again within
`--recovery-limit-s`.
Run: python benchmarks/faults.py [--fault replica|engine] [--emulated qwen25-omni] [--seconds 90]
     [--profile-cache DIR] [--seed 0] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from bench_plan_loop import stop, workload
from soak import add_server_arguments, finish, start

import prismserve  # noqa: F401  (telemetry off)
from prismserve.bench.loadgen import RequestResult, run_load
from prismserve.bench.workloads import RequestSpec, poisson_times


def replicas(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Every replica of the server's status, with its deployment's key."""
    return [
        {**replica, "deployment": key}
        for key, deployment in status["deployments"].items()
        for replica in deployment.get("replicas", [])
    ]


def victim_pid(replica: dict[str, Any], fault: str) -> int:
    """The process to kill: the replica's own, or its engine (the first process under it)."""
    if fault == "replica":
        return int(replica["pid"])
    children = psutil.Process(int(replica["pid"])).children(recursive=True)
    if not children:
        raise SystemExit(f"replica {replica['deployment']}#{replica['id']} runs no engine process to kill")
    return children[0].pid


async def inject(admin: httpx.AsyncClient, fault: str, at_s: float, zero: float, limit_s: float) -> dict:
    """Kill the busiest replica (or its engine) `at_s` after `zero`; wait for it to run again."""
    await asyncio.sleep(zero + at_s - time.perf_counter())
    running = [r for r in replicas((await admin.get("/admin/status")).json()) if r["state"] == "running"]
    target = max(running, key=lambda r: r["in_flight"])
    pid = victim_pid(target, fault)
    os.kill(pid, signal.SIGKILL)
    killed_s = time.perf_counter() - zero
    recovered_s = None
    while time.perf_counter() - zero - killed_s < limit_s:
        await asyncio.sleep(0.1)
        again = next(
            r
            for r in replicas((await admin.get("/admin/status")).json())
            if (r["deployment"], r["id"]) == (target["deployment"], target["id"])
        )
        if again["state"] == "running" and again["restarts"] > target["restarts"]:
            recovered_s = time.perf_counter() - zero - killed_s
            break
    return {
        "deployment": target["deployment"],
        "replica": target["id"],
        "held_at_kill": target["in_flight"],
        "killed_pid": pid,
        "killed_s": killed_s,
        "recovery_s": recovered_s,
    }


def outcome(results: list[RequestResult], fault: dict) -> dict:
    """What the kill cost: the failures, each with whether it was in flight at the kill."""
    killed, recovered = fault["killed_s"], fault["killed_s"] + (fault["recovery_s"] or 0.0)
    failed = [
        {
            "status": r.status,
            "error": r.error[:160],
            "in_flight_at_kill": r.sent_s <= killed <= r.done_s,
        }
        for r in results
        if not r.ok
    ]
    before = [r.latency_s for r in results if r.ok and r.done_s < killed]
    after = [r.latency_s for r in results if r.ok and r.sent_s > recovered]
    return {
        "requests": len(results),
        "failed": failed,
        "latency_p50_before_s": statistics.median(before) if before else None,
        "latency_p50_after_s": statistics.median(after) if after else None,
    }


async def measure(url: str, name: str, rate: float, args: argparse.Namespace, token: str) -> dict:
    count = max(1, round(rate * args.seconds))
    times = poisson_times(np.random.default_rng(args.seed), rate, count, None)
    specs = [
        RequestSpec(**{**vars(s), "arrival_s": float(t)})
        for s, t in zip(workload(count, args.seed + 10), times, strict=True)
    ]
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as admin:
        zero = time.perf_counter() + 5.0  # the bodies are built meanwhile
        load = run_load(url, name, specs, progress=False, start=zero)
        results, fault = await asyncio.gather(
            load, inject(admin, args.fault, args.seconds / 3, zero, args.recovery_limit_s)
        )
    return {**fault, **outcome(results, fault)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fault", choices=["replica", "engine"], default="replica")
    add_server_arguments(parser)
    parser.add_argument(
        "--load", type=float, default=0.5, help="arrival rate / the plan's predicted capacity"
    )
    parser.add_argument("--seconds", type=float, default=90.0, help="seconds of load")
    parser.add_argument("--recovery-limit-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    token = os.environ.setdefault("PRISMSERVE_ADMIN_TOKEN", secrets.token_urlsafe(16))
    with tempfile.TemporaryDirectory(prefix="prismserve-faults-") as folder:
        process, url, predicted, name = start(args, Path(folder))
        try:
            report = asyncio.run(measure(url, name, args.load * predicted, args, token))
        finally:
            stop(process)
    report = {"model": name, "fault": args.fault, "predicted_rps": predicted, "load": args.load, **report}
    unexpected = [f for f in report["failed"] if not f["in_flight_at_kill"] or not f["status"]]
    report["passed"] = not unexpected and report["recovery_s"] is not None
    statuses = sorted({f["status"] for f in report["failed"]})
    finish(
        report,
        args.out,
        f"{args.fault} of {report['deployment']}#{report['replica']} killed at {report['killed_s']:.1f} s "
        f"({report['held_at_kill']} in flight on it): {len(report['failed'])} of {report['requests']} "
        f"requests failed (statuses {statuses}, {len(unexpected)} not in flight at the kill), running again "
        f"after {report['recovery_s'] if report['recovery_s'] is None else round(report['recovery_s'], 2)} s; "
        f"median latency {report['latency_p50_before_s']} s before, {report['latency_p50_after_s']} s after",
    )


if __name__ == "__main__":
    main()
