"""Toy components: tiny stand-ins for encoders, an LLM, a talker and a vocoder, with fake executors.

They exercise the task layer, apps and the demo without any model weights.
"""

from pathlib import Path

APP_PATH = Path(__file__).with_name("omni_app.py")
"""The toy Omni app (encoders, LLM, talker, vocoder on fake executors)."""

MLLM_APP_PATH = Path(__file__).with_name("mllm_app.py")
"""The toy MLLM app (image encoder fissioned from the LLM)."""
