"""Telemetry off, hub offline mode on request, and the same settings on every replica.

Telemetry is switched off by default but a user's own setting wins. Hub offline mode stops
downloads, which users need: it is never forced here, only set by a process that must not reach the
hub (`prismserve serve --offline`, the demo, tests, benchmarks) through `go_offline`.
"""

import os

TELEMETRY_OFF = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}

HUB_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

# Where and whether replicas download checkpoints: they follow the serving process.
HUB_VARIABLES = (*HUB_OFFLINE, "HF_ENDPOINT")

# The device model replicas run on (`cpu`: the CPU even on GPUs Ray gave them; prismserve.models.base).
DEVICE_VARIABLE = "PRISMSERVE_DEVICE"


def disable_telemetry() -> None:
    """Turn telemetry off in this process (and so in every child it starts), unless the user chose."""
    for name, value in TELEMETRY_OFF.items():
        os.environ.setdefault(name, value)


def go_offline() -> None:
    """Hub offline mode for this process and its replicas; call it before the Hugging Face libraries
    are imported (they read it once)."""
    os.environ.update(HUB_OFFLINE)


def replica_env() -> dict[str, str]:
    """The environment variables every replica gets: telemetry, hub and device settings as this
    process has them."""
    disable_telemetry()
    names = (*TELEMETRY_OFF, *HUB_VARIABLES, DEVICE_VARIABLE)
    return {name: os.environ[name] for name in names if name in os.environ}
