"""Emulated models: paper-scale any-to-any models on `sim` executors and fake GPUs (000 §7 on a CPU machine).

A cost model turns a request into work per component (A100-seconds from 000 Table 1), deployment
options say how components are deployed and batch, and the same definitions give the planner its
profiles and the runtime its `sim` profiles.
"""

from prismserve.emulate.catalog import (
    INTERNVL3,
    LLAVA15,
    MODELS,
    QWEN3_OMNI,
    QWEN25_OMNI,
    QWEN25_VL,
    QWEN_IMAGE,
)
from prismserve.emulate.model import DEPLOYMENT_PREFIX, EmulatedModel, EmulatedOption

__all__ = [
    "DEPLOYMENT_PREFIX",
    "INTERNVL3",
    "LLAVA15",
    "MODELS",
    "QWEN3_OMNI",
    "QWEN25_OMNI",
    "QWEN25_VL",
    "QWEN_IMAGE",
    "EmulatedModel",
    "EmulatedOption",
]
