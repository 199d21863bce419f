"""prismserve: a serving system for any-to-any multimodal models."""

from prismserve.offline import disable_telemetry

# Before anything imports Ray, vLLM or the Hugging Face libraries. Hub offline mode stays the user's choice.
disable_telemetry()

__version__ = "0.1.0"
