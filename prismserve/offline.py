"""Telemetry off: the one place prismserve tells Ray, vLLM and Hugging Face not to phone home."""

import os

TELEMETRY_OFF = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}


def disable_telemetry() -> None:
    """Set the opt-out variables in this process (and so in every child it starts)."""
    for name, value in TELEMETRY_OFF.items():
        os.environ[name] = value
