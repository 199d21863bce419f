"""The real-size cost script (benchmarks/gpu_costs.py) on the CPU with one layer and small inputs:
FLOPs counted, times fitted, and the simulations' assumptions read from their module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_costs  # noqa: E402

pytestmark = pytest.mark.bench_script


def test_the_fit_splits_time_into_a_call_overhead_and_a_cost_per_item():
    assert gpu_costs.fit([1, 2, 4], [3.0, 5.0, 9.0]) == pytest.approx((1.0, 2.0))


@pytest.mark.timeout(600)
def test_every_component_is_timed_and_its_flops_counted(tmp_path):
    out = tmp_path / "costs.json"
    environment = {**os.environ, "PRISMSERVE_DEVICE": "cpu"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_costs.py"),
            "--quick",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=570,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["components"]) == {c.name for c in gpu_costs.COMPONENTS}
    assert report["datasheet_bf16_tflops"] is None and report["matmul_tflops"] > 0  # a CPU: no datasheet
    for name, result in report["components"].items():
        shapes = result["shapes"]
        # FLOPs grow with the input and every forward was timed.
        assert 0 < shapes[0]["tflop"] < shapes[1]["tflop"], name
        assert all(s["ms"] > 0 and s["tflops"] > 0 for s in shapes), name
        # No datasheet peak for a CPU; the fitted slope (so the MFU) is too noisy on one layer to pin.
        assert "mfu_of_matmul" in result and result["mfu_of_datasheet"] is None, name
    assumed = report["simulations_assume"]
    assert assumed["encoder_mfu"] == 0.5 and set(assumed["prefill_mfu"]) == {"InternVL-26B", "Llama3.2-11B"}
