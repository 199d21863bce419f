"""The GPU check's wrapper runs on the CPU (PRISMSERVE_DEVICE=cpu) end to end: every family's split
equals its monolith and its engine batches, as the JSON it writes says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
FAMILIES = {"qwen2.5-vl", "internvl3", "gemma3", "qwen2.5-omni", "qwen3-omni", "qwen-image"}

pytestmark = pytest.mark.bench_script


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PRISMSERVE_DEVICE": "cpu", "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=tmp_path,  # the script finds the source tree from its own place
        env=environment,
        capture_output=True,
        text=True,
        timeout=840,
    )


# About 40 s of CPU time; minutes of wall-clock time on a machine shared with other work.
@pytest.mark.timeout(900)
def test_gpu_check_on_cpu_covers_every_family(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = run(tmp_path, "--quick", "--out", str(out))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["device"] == "cpu" and results["device_name"].startswith("cpu")
    assert set(results["families"]) == FAMILIES and results["ok"] is True
    for family, result in results["families"].items():
        assert result["equality"]["equal"] is True, family
        batching = result["batching"]
        assert batching["batched"] is True, family
        if family == "qwen-image":  # two paintings: one DiT forward per step for both
            assert batching["dit_forwards_together"] * 2 == batching["dit_forwards_alone"]
        else:  # four requests decoded together, each as alone
            assert batching["peak_batch"] >= 2 and batching["tokens_equal_alone"]
            assert batching["max_logit_diff_alone"] < 1e-3
            assert batching["decode_steps"] < batching["serial_decode_steps"]
        assert result["steps_ms"] and all(row["median_ms"] > 0 for row in result["steps_ms"].values())
    omni = results["families"]["qwen2.5-omni"]
    assert {"image-encoder", "audio-encoder", "thinker-decode", "talker-decode", "vocoder-utterance"} <= set(
        omni["steps_ms"]
    )
    assert omni["equality"]["audio_peak"] > 0.05  # the audio compared is not silence
    assert {"dit-forward", "vae-decode", "text-encoder"} <= set(results["families"]["qwen-image"]["steps_ms"])
    assert results["memory_share"]["skipped"] is True and "CUDA" in results["memory_share"]["why"]
    assert results["serving_stack_imported"] == []
    assert "all checks passed" in done.stdout


def test_missing_packages_are_listed_with_install_hints(tmp_path):
    # A python that finds no diffusers or av: a folder of stub finders shadowing them on PYTHONPATH.
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in ('diffusers', 'av'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    done = run(tmp_path, PYTHONPATH=str(blocker))
    assert done.returncode == 2
    assert "diffusers>=0.40" in done.stderr and "av>=14" in done.stderr
    assert "GPU_CHECK_WHEELS" in done.stderr and "torch>=" not in done.stderr
    # Families that need neither: past the import check to the script's own (here: refused) arguments.
    done = run(tmp_path, "--families", "gemma3", "--tokens", "0", PYTHONPATH=str(blocker))
    assert done.returncode == 2 and "needs" not in done.stderr
    assert "--tokens, --codes and --repeats take numbers from 1 up" in done.stderr
