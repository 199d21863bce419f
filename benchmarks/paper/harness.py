"""Shared by the paper reproductions: start a gateway on fake GPUs, deploy plans, load it, measure.

Each reproduction deploys an emulated model (prismserve.emulate) behind a real `prismserve serve`
process (Ray runtime, `sim` executors, declared GPUs), sends a workload with the open-loop load
generator over HTTP, and compares the measured throughput with the planner's prediction.
Sim times are divided by `speedup` so that runs take seconds, not minutes; every throughput is
reported at A100 scale (measured / speedup) next to the raw figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

import prismserve  # noqa: F401  (telemetry off)
from prismserve.bench.loadgen import RequestResult, run_load
from prismserve.bench.metrics import summarize
from prismserve.bench.workloads import RequestSpec, type_mix, write_requests
from prismserve.emulate.app import app_source
from prismserve.emulate.model import EmulatedModel
from prismserve.planner import Plan, plan_for_budget

RESULTS = Path(__file__).resolve().parents[1] / "results"


class Server:
    """A `prismserve serve` process serving one emulated model on `gpus` declared GPUs.

    With `plan_for` (a workload), the server plans itself at start (`--gpus`, `--profile-workload`):
    it profiles the emulated app by timing its replicas (sim times divided by `speedup`), so its
    prediction is a measurement's, not the emulation's own capacity. The experiments
    measure that plan, so it is kept (`--no-replan`).
    """

    def __init__(
        self,
        model: EmulatedModel,
        gpus: int,
        routing: str = "static",
        plan_for: list[RequestSpec] | None = None,
        speedup: float = 1.0,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.model, self.gpus, self.routing = model, gpus, routing
        self.extra = extra  # more `prismserve serve` flags (e.g. --record-trace FILE)
        self.plan_for, self.speedup = plan_for, speedup
        self.token = secrets.token_hex(8)
        self.url = ""
        self._dir = tempfile.TemporaryDirectory(prefix="prismserve-bench-")
        self._process: subprocess.Popen[str] | None = None

    @property
    def declared_gpus(self) -> int:
        """GPUs to declare: the budget, or more when registering the app takes more — the runtime
        starts one replica of every deployment option before the plan replaces them (Qwen3-Omni's
        nine options need 11 GPUs); plans still use `gpus`."""
        return max(self.gpus, sum(option.gpus for option in self.model.options))

    def __enter__(self) -> Server:
        app = Path(self._dir.name) / f"{self.model.name}.py"
        app.write_text(app_source(self.model.name))
        command = [
            sys.executable,
            "-m",
            "prismserve",
            "serve",
            str(app),
            "--offline",
            "--name",
            self.model.name,
            "--fake-gpus",
            str(self.declared_gpus),
            "--port",
            "0",
            "--routing",
            self.routing,
            *self.extra,
        ]
        env = {**os.environ, "PRISMSERVE_ADMIN_TOKEN": self.token}
        if self.plan_for is not None:
            workload = Path(self._dir.name) / "workload.jsonl"
            write_requests(self.plan_for, workload)
            command += ["--gpus", str(self.gpus), "--profile-workload", str(workload), "--no-replan"]
            # A profile is kept under a key of everything it depends on (app, hardware, workload,
            # version): a cache the user names is reused across runs, else each run measures anew.
            cache = os.environ.get("PRISMSERVE_PROFILE_CACHE") or self._dir.name
            env |= {"PRISMSERVE_SIM_SPEEDUP": str(self.speedup), "PRISMSERVE_PROFILE_CACHE": cache}
        self._process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        # With `plan_for` the server profiles the emulated app on its replicas before it serves:
        # minutes on a busy machine at a low speedup; starting replicas alone can take minutes there.
        deadline = time.monotonic() + (2400 if self.plan_for is not None else 360)
        lines = []
        while time.monotonic() < deadline:
            line = self._process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "serving app" in line:
                self.url = line.rsplit(" at ", 1)[1].strip()
                # Keep reading the server's output so its pipe never fills up.
                threading.Thread(target=self._process.stdout.read, daemon=True).start()
                return self
        self.__exit__(None, None, None)
        raise RuntimeError("the server did not start:\n" + "".join(lines[-30:]))

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(60)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._dir.cleanup()

    def planned(self) -> Plan:
        """The plan the server made for itself at start, in the planner's terms (A100 scale)."""
        response = httpx.get(
            f"{self.url}/admin/apps/{self.model.name}/plan",
            headers={"authorization": f"Bearer {self.token}"},
            timeout=60,
        )
        if response.status_code != 200:
            raise RuntimeError(f"no plan deployed: {response.status_code} {response.text}")
        return self.model.planner_plan(Plan.model_validate(response.json()), self.speedup)

    def deploy(self, plan: Plan, speedup: float) -> None:
        """Apply a planner result (cells, routing, sim profiles); returns when its replicas are up."""
        body = self.model.deployment_plan(plan, speedup).model_dump(mode="json", exclude_none=True)
        response = httpx.post(
            f"{self.url}/admin/apps/{self.model.name}/plan",
            json=body,
            headers={"authorization": f"Bearer {self.token}"},
            timeout=600,
        )
        if response.status_code != 200:
            raise RuntimeError(f"deploying failed: {response.status_code} {response.text}")


@dataclass
class Run:
    """One deployment under one workload: the plan, what was predicted, what was measured."""

    label: str
    plan: Plan
    speedup: float
    summary: dict
    results: list[RequestResult]
    exact_rps: float  # the emulation's own capacity for this plan (model.capacity), at A100 scale

    @property
    def predicted_rps(self) -> float:
        """The planner's throughput at A100 scale."""
        return self.plan.throughput

    @property
    def measured_rps(self) -> float:
        """Measured capacity at A100 scale: the completion rate between ramp-up and ramp-down
        (every run is overloaded), so the edges of a short run do not count against it."""
        return self.summary["steady_rps"] / self.speedup

    @property
    def makespan_rps(self) -> float:
        """Requests / makespan at A100 scale (000 §7.1's definition, ramp-down included)."""
        return self.summary["throughput_rps"] / self.speedup

    @property
    def accuracy(self) -> float:
        """Achieved / predicted throughput."""
        return self.measured_rps / self.predicted_rps if self.predicted_rps else 0.0

    @property
    def delivered(self) -> float:
        """Achieved / the emulation's exact capacity for the plan: what the runtime delivers."""
        return self.measured_rps / self.exact_rps if self.exact_rps else 0.0

    def to_json(self) -> dict:
        return {
            "exact_rps": self.exact_rps,
            "delivered": self.delivered,
            "label": self.label,
            "plan": self.plan.to_json_dict(),
            "speedup": self.speedup,
            "predicted_rps": self.predicted_rps,
            "measured_rps": self.measured_rps,
            "makespan_rps": self.makespan_rps,
            "accuracy": self.accuracy,
            "summary": self.summary,
        }


def plan_for(spec, gpus: int) -> Plan:
    """The planner's plan for one cell budget of `gpus` GPUs (cells up to that size)."""
    return plan_for_budget(spec, gpus, max_exponent=gpus.bit_length() - 1)


def measure(
    server: Server,
    label: str,
    plan: Plan,
    specs: list[RequestSpec],
    speedup: float,
    warmup: int,
    deployed: bool = False,
) -> Run:
    """Deploy `plan` (unless the server `deployed` it itself), send `specs` (open loop), and summarise."""
    if not deployed:
        server.deploy(plan, speedup)
    print(
        f"  {label}: {plan.gpus} GPUs, cells {[(c.gpus, c.count, c.replicas) for c in plan.cells]}",
        flush=True,
    )
    results = asyncio.run(run_load(server.url, server.model.name, specs, progress=sys.stderr.isatty()))
    summary = summarize(results, warmup)
    replicas: dict[str, int] = {}
    for cell in plan.cells:
        for name, n in cell.replicas.items():
            replicas[name] = replicas.get(name, 0) + n * cell.count
    run = Run(label, plan, speedup, summary, results, server.model.capacity(replicas, plan.routing, specs))
    print(
        f"  {label}: measured {run.measured_rps:.3f} req/s (A100 scale; raw {summary['steady_rps']:.1f}; "
        f"requests/makespan {run.makespan_rps:.3f}), "
        f"predicted {run.predicted_rps:.3f} (exact for the emulation {run.exact_rps:.3f}), "
        f"achieved/predicted {run.accuracy:.2f}, achieved/exact {run.delivered:.2f}, "
        f"failed {summary['failed']}, p50 {summary['latency_s']['p50']:.2f} s",
        flush=True,
    )
    if summary["failed"]:
        print(f"  errors: {summary['errors']}", flush=True)
    return run


def retime(specs: list[RequestSpec], rate: float) -> list[RequestSpec]:
    """The same requests with arrival times scaled to mean `rate` (Poisson shape kept)."""
    last = specs[-1].arrival_s or 1.0
    factor = (len(specs) - 1) / last / rate
    return [RequestSpec(**{**vars(s), "arrival_s": s.arrival_s * factor}) for s in specs]


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """`--out DIR` (alias `--results`, the name `prismserve bench paper` passes): where a script
    writes its JSON and PNGs."""
    parser.add_argument(
        "--out",
        "--results",
        dest="out",
        type=Path,
        default=RESULTS,
        help="where to write JSON and PNG (default benchmarks/results)",
    )


def write(name: str, data: dict, folder: Path = RESULTS) -> Path:
    """Save a result as <folder>/<name>.json (benchmarks/results by default)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=float))
    return path


def describe_workload(specs: list[RequestSpec]) -> dict:
    """Size and type mix of a workload, for the result files."""
    return {"requests": len(specs), "mix": type_mix(specs)}


@contextlib.contextmanager
def started(make: Callable[[], Server], tries: int = 3) -> Iterator[Server]:
    """A started server (`make()` entered), tried again when it did not start: on a machine shared
    with other work a local Ray's start can time out (`The current node timed out during startup`)."""
    for attempt in range(1, tries + 1):
        server = make()
        try:
            server.__enter__()
        except RuntimeError as exc:
            if attempt == tries:
                raise
            print(
                f"  the server did not start (try {attempt} of {tries}): {str(exc).strip().splitlines()[-1]}"
            )
            continue
        try:
            yield server
        finally:
            server.__exit__(None, None, None)
        return
