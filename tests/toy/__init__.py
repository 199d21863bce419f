"""Toy components: tiny stand-ins for encoders, an LLM, a talker and a vocoder, with fake executors.

A test fixture (tests and benchmarks import it as `toy`, with `tests/` on the path): they exercise
the task layer, apps and the runtime without any model weights. Ray workers started from a process
that imported it must import it too, so its directory joins PYTHONPATH, which they inherit.
"""

import os
from pathlib import Path

import prismserve  # noqa: F401  (telemetry off)

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)

APP_PATH = Path(__file__).with_name("omni_app.py")
"""The toy Omni app (encoders, LLM, talker, vocoder on fake executors)."""

MLLM_APP_PATH = Path(__file__).with_name("mllm_app.py")
"""The toy MLLM app (image encoder fissioned from the LLM)."""
