"""Profiles kept per app, model and hardware: measuring takes minutes, re-reading one takes none.

The key covers what changes the numbers: the app's source and its deployments' configurations
(checkpoints, engines, GPU shapes), the hardware (the cluster's GPUs, this machine's CPUs, the
device replicas run on), the workload and the measuring settings, and prismserve's version.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from prismserve.app import App
from prismserve.planner import PlanSpec, SpecError, load_spec


def cache_dir() -> Path:
    """Where profiles are kept: $PRISMSERVE_PROFILE_CACHE, else ~/.cache/prismserve/profiles."""
    chosen = os.environ.get("PRISMSERVE_PROFILE_CACHE")
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prismserve" / "profiles"


def hardware(runtime: Any) -> dict[str, Any]:
    """What the measurements depend on in the machines: GPUs per node, CPUs, the replicas' device."""
    resources = getattr(runtime, "resources", None)
    gpus = sorted(resources.inventory().values()) if resources is not None else []
    return {
        "gpus_per_node": gpus,
        "fake_gpus": getattr(runtime, "fake_gpus", None) is not None,
        "device": os.environ.get("PRISMSERVE_DEVICE", ""),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "node": platform.node(),
    }


def cache_key(app: App, source: str, about: dict[str, Any]) -> str:
    """A digest of everything a profile of `app` depends on (`about`: hardware, workload, settings)."""
    from prismserve import __version__

    deployments = sorted(t.deployment_key() for t in app.named_unit_tasks().values())
    text = json.dumps([source, deployments, about, __version__], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path(app: App, key: str) -> Path:
    """The file of `app`'s profile under `key`."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in app.name)
    return cache_dir() / f"{safe}-{key}.yaml"


def cached(path: Path) -> PlanSpec | None:
    """The profile at `path`, or None when there is none (or it no longer reads as a spec)."""
    if not path.is_file():
        return None
    try:
        return load_spec(path)
    except SpecError:
        return None
