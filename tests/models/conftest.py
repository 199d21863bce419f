"""Tiny checkpoints (built once into the tiny-model cache) and the shared media."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiers import uses
from vllm_jobs import VLLMProbes

import prismserve  # noqa: F401  (telemetry off)
from prismserve.bench.workloads import workloads_dir


@pytest.fixture(scope="session")
def tiny_vl() -> str:
    from prismserve.models import tiny

    return str(tiny.build("qwen2.5-vl"))


@pytest.fixture(scope="session")
def cars_jpg() -> bytes:
    return (workloads_dir() / "media" / "cars.jpg").read_bytes()


@pytest.fixture(scope="session")
def small_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (90, 60), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def media_path(name: str) -> Path:
    return workloads_dir() / "media" / name


@pytest.fixture(scope="session")
def tiny_omni() -> str:
    from prismserve.models import tiny

    return str(tiny.build("qwen2.5-omni"))


@pytest.fixture(scope="session")
def query_wav() -> bytes:
    return (workloads_dir() / "media" / "query_to_cars.wav").read_bytes()


@pytest.fixture(scope="session")
def tiny_image() -> str:
    from prismserve.models import tiny

    return str(tiny.build("qwen-image"))


@pytest.fixture(scope="session")
def tiny_internvl() -> str:
    from prismserve.models import tiny

    return str(tiny.build("internvl3"))


@pytest.fixture(scope="session")
def tiny_gemma3() -> str:
    from prismserve.models import tiny

    return str(tiny.build("gemma3"))


@pytest.fixture(scope="session")
@uses("vllm")
def vllm_probes() -> Iterator[VLLMProbes]:
    """The probe scripts' runner in the vLLM environment: one process for the run (`VLLMProbes`)."""
    probes = VLLMProbes()
    yield probes
    probes.close()
