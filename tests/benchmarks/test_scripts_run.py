"""Every benchmark script runs to the end on tiny settings (figures are not checked: they are not tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Minutes of smoke runs: marked `slow` with it (tests/tiers.py), `pytest -m "not slow"` skips them
# locally; CI runs everything.
pytestmark = pytest.mark.bench_script

SCRIPTS = {
    "bench_record_replay.py": ["--requests", "50", "--warmup", "5"],
    "bench_planner.py": ["--repeats", "1"],
    "bench_plan_loop.py": ["--runs", "1", "--requests", "6"],
    "bench_dataplane.py": ["--mb", "4", "--repeats", "3"],
    "bench_control_plane.py": ["--requests", "60", "--concurrency", "4"],
    "bench_transports.py": ["--calls", "20"],
    "bench_routing.py": ["--clients", "4", "--seconds", "1"],
    "bench_vocoder.py": ["--codes", "60", "--rounds", "1", "--at-once", "2"],
    # Files only: NIXL is not part of the vLLM environment `prismserve vllm-env` builds.
    "bench_kv_transfer.py": ["--lengths", "64", "--repeats", "1", "--connectors", "files"],
    "bench_omni.py": [
        "--clients",
        "2",
        "--requests",
        "4",
        "--rounds",
        "1",
        "--max-tokens",
        "4",
        "--max-codes",
        "60",
        "--family",
        "qwen3-omni",
        "--engine",
        "vllm",
    ],
    "bench_hf_batching.py": ["--clients", "2", "--requests", "4", "--rounds", "1", "--max-tokens", "4"],
    "bench_vllm.py": [
        "--clients",
        "2",
        "--requests",
        "4",
        "--rounds",
        "1",
        "--max-tokens",
        "4",
        "--family",
        "gemma3",
    ],
}


def run_script(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a script to the end. One that hangs fails the test with every thread's stack (faulthandler
    prints them on SIGABRT): a hang is a defect to find, never re-run away."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""}
    process = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        _, stderr = process.communicate()
        pytest.fail(f"{Path(args[0]).name} hung for {timeout:.0f} s; its stacks:\n{stderr[-6000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_script_runs_and_writes_json(script, tmp_path):
    out = tmp_path / "result.json"
    # The plan loop profiles a tiny Omni on Ray before it serves: minutes, not seconds.
    limit = 450 if script == "bench_plan_loop.py" else 200
    result = run_script([str(ROOT / "benchmarks" / script), *SCRIPTS[script], "--out", str(out)], ROOT, limit)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(out.read_text())


PAPER = {
    "fig6a_omni.py": ["--gpus", "8", "--requests", "40", "--speedup", "50"],
    "fig10_internvl3.py": ["--workloads", "Less text", "--requests", "40", "--speedup", "50"],
    "sec74_routing.py": ["--requests", "40", "--speedup", "50"],
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", sorted(PAPER))
def test_paper_reproduction_runs_and_writes_its_results(script, tmp_path):
    # Each starts `prismserve serve` on declared GPUs, deploys planned and baseline plans, loads them.
    paper = ROOT / "benchmarks" / "paper"
    result = run_script([str(paper / script), *PAPER[script], "--results", str(tmp_path)], paper, 270)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    (written,) = tmp_path.glob("*.json")
    runs = list(_runs(json.loads(written.read_text())))
    assert runs and all(run["summary"]["failed"] == 0 and run["measured_rps"] > 0 for run in runs)
    report = run_script(["report.py", "--results", str(tmp_path)], paper, 60)
    assert report.returncode == 0 and "| experiment | paper | ours |" in report.stdout


def _runs(data: dict):
    for group in ("cells", "workloads"):
        for entry in data.get(group, {}).values():
            yield from entry["runs"].values()
    yield from data.get("runs", {}).values()


@pytest.mark.timeout(300)
def test_fig10_queueing_model_runs_and_reproduces_the_short_run_shortfall(tmp_path):
    # The event model of Figure 10 (virtual time): seconds, not minutes.
    paper = ROOT / "benchmarks" / "paper"
    args = ["fig10_queueing.py", "--requests", "300", "--repeats", "1", "--workloads", "Less text"]
    result = run_script([*args, "--results", str(tmp_path)], paper, 240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    runs = json.loads((tmp_path / "fig10_queueing.json").read_text())["runs"]["300 Less text"]
    assert runs["Monolith"]["accuracy"] > 0.97  # one stage: full from the overload at once
    assert runs["prismserve"]["accuracy"] < runs["Monolith"]["accuracy"]  # its fed stages still filling
    assert all(0 < stage["busy"] <= 1.0 + 1e-9 for run in runs.values() for stage in run["stages"].values())


@pytest.mark.timeout(300)
def test_a_plan_change_on_a_full_cluster_under_load_fails_no_request():
    # The running 8-GPU cell is drained and removed while requests arrive; two 4-GPU cells replace it.
    paper = ROOT / "benchmarks" / "paper"
    # Sim times / 8: the change, posted 4 s into the 9 s of arrivals, still drains a loaded cell.
    args = ["replan_drain.py", "--requests", "300", "--after", "4", "--speedup", "8"]
    result = run_script(args, paper, 240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "-> [(4, 2, " in result.stdout and result.stdout.rstrip().endswith("failed 0")


@pytest.mark.timeout(300)
def test_the_modserve_ablation_and_autoscaling_run_and_write_their_results(tmp_path):
    # Every system of the ablation once, at one load, and the four autoscaling runs, on a short workload.
    paper = ROOT / "benchmarks" / "paper"
    args = [
        "modserve.py",
        "--requests",
        "60",
        "--loads",
        "0.5",
        "--encoders",
        "6",
        "--burst-requests",
        "80",
    ]
    result = run_script([*args, "--speedup", "64", "--out", str(tmp_path)], paper, 280)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    data = json.loads((tmp_path / "modserve.json").read_text())
    assert [row["system"] for row in data["rows"]] == ["monolith", "decoupled", "+slo", "+tokens", "+fan-out"]
    assert [row["system"] for row in data["autoscaling"]] == [
        "monolith static",
        "monolith auto",
        "+fan-out static",
        "+fan-out auto",
    ]
    assert all(row["failed"] == 0 and row["goodput_rps"] > 0 for row in data["rows"] + data["autoscaling"])
    assert all(row["gpu_hours"] > 0 for row in data["autoscaling"])


@pytest.mark.timeout(300)
def test_triinfer_replay_runs_its_figures_in_quick_form(tmp_path):
    # Virtual time: Figures 9-11 and the layout search on 4 instances, Poisson arrivals (no trace files).
    paper = ROOT / "benchmarks" / "paper"
    args = [
        "triinfer.py",
        "--quick",
        "--requests",
        "800",
        "--arrivals",
        "poisson",
        "--results",
        str(tmp_path),
    ]
    result = run_script(args, paper, 240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    data = json.loads((tmp_path / "triinfer_quick_poisson_seed0.json").read_text())
    assert all(row["goodput_per_gpu"] > 0 for row in data["figure9"]["TextCaps"].values())
    assert data["exhaustive_summary"]["cases"] == 1 and len(data["exhaustive"]) == 1
    (case,) = data["exhaustive"].values()
    assert case["layouts"] == 9 and 0 < case["ratio_to_best"] <= 1


def _paper_module(name: str):
    """A paper script imported as a module (its `rows` and `details` read the JSON it wrote)."""
    import importlib.util

    path = ROOT / "benchmarks" / "paper" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"paper_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_dataplane_sweep_quick_writes_sizes_rates_embeddings_and_plots(tmp_path):
    # Two replicas on Ray moving payloads over every transport: seconds.
    paper = ROOT / "benchmarks" / "paper"
    result = run_script(["dataplane_sweep.py", "--quick", "--out", str(tmp_path)], paper, 240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    data = json.loads((tmp_path / "dataplane_sweep.json").read_text())
    module = _paper_module("dataplane_sweep")
    assert set(data["by_size"]) == set(module.TRANSPORTS)
    shm = data["by_size"]["shm, copy"]
    assert [r["bytes"] for r in shm] == module.QUICK_SIZES
    assert all(r["p50_ms"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in shm)
    assert shm[-1]["p50_ms"] > shm[0]["p50_ms"]  # 16 MiB copies take longer than 4 KiB
    emb = data["embeddings"]["transports"]["shm, copy"]
    assert [r["tokens"] for r in emb] == module.QUICK_TOKENS
    assert all(r["bytes"] == r["tokens"] * 3584 * 2 for r in emb)
    rates = data["by_rate"]["transports"]["ray object store"]
    assert [r["offered_rps"] for r in rates] == module.QUICK_RATES and all(
        r["achieved_rps"] > 0 for r in rates
    )
    assert len(list(tmp_path.glob("dataplane_sweep_*.png"))) == 4
    rows = module.rows(tmp_path)
    assert len(rows) == 3 and all(len(row) == 5 for row in rows)
    assert rows[2][1] == "5 ms" and float(rows[2][3]) > 0  # ModServe's P99 and our ratio to it
    assert "| size |" in module.details(tmp_path)


@pytest.mark.timeout(300)
def test_startup_quick_times_a_real_replica_start(tmp_path):
    # One image-encoder replica started on Ray the way `prismserve serve` starts it, then stopped.
    paper = ROOT / "benchmarks" / "paper"
    result = run_script(["startup.py", "--quick", "--out", str(tmp_path)], paper, 240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    data = json.loads((tmp_path / "startup.json").read_text())
    (row,) = data["rows"]
    assert row["component"].startswith("image encoder") and row["mode"] == "cold"
    assert len(row["starts_s"]) == 1 and row["median_s"] == row["starts_s"][0] > 0
    assert row["paper_row"] == "Encoder" and row["paper_s"] == 21.7
    assert (tmp_path / "startup_table4.png").exists()
    module = _paper_module("startup")
    (readme_row,) = module.rows(tmp_path)
    assert readme_row[1] == "21.7 s" and float(readme_row[3]) > 0
    assert "| image encoder (Qwen2.5-VL) | cold |" in module.details(tmp_path)
