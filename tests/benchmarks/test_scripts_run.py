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
