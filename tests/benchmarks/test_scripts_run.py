"""Every benchmark script runs to the end on tiny settings (figures are not checked: they are not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS = {
    "bench_record_replay.py": ["--requests", "50", "--warmup", "5"],
    "bench_planner.py": ["--repeats", "1"],
    "bench_dataplane.py": ["--mb", "4", "--repeats", "3"],
    "bench_control_plane.py": ["--requests", "60", "--concurrency", "4"],
    "bench_routing.py": ["--clients", "4", "--seconds", "1"],
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_script_runs_and_writes_json(script, tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *SCRIPTS[script], "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=240, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(out.read_text())


PAPER = {
    "fig6a_omni.py": ["--gpus", "8", "--requests", "40", "--speedup", "50"],
    "fig10_internvl3.py": ["--workloads", "Less text", "--requests", "40", "--speedup", "50"],
    "sec74_routing.py": ["--requests", "40", "--speedup", "50"],
}


@pytest.mark.parametrize("script", sorted(PAPER))
def test_paper_reproduction_runs_and_writes_its_results(script, tmp_path):
    # Each starts `prismserve serve` on declared GPUs, deploys planned and baseline plans, loads them.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "paper" / script), *PAPER[script], "--results", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=280, cwd=ROOT / "benchmarks" / "paper",
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    (written,) = tmp_path.glob("*.json")
    runs = list(_runs(json.loads(written.read_text())))
    assert runs and all(run["summary"]["failed"] == 0 and run["measured_rps"] > 0 for run in runs)
    report = subprocess.run(
        [sys.executable, "report.py", "--results", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT / "benchmarks" / "paper"
    )
    assert report.returncode == 0 and "| experiment | paper | ours |" in report.stdout


def _runs(data: dict):
    for group in ("cells", "workloads"):
        for entry in data.get(group, {}).values():
            yield from entry["runs"].values()
    yield from data.get("runs", {}).values()
