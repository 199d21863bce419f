"""Fixtures of the gateway tests: a gateway over an in-process runtime with the test apps registered."""

from __future__ import annotations

import httpx
import openai
import pytest
from gateway_apps import ADMIN, APPS, TOKEN, flaky_llm
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime


@pytest.fixture
def gateway(serve_gateway):
    """An httpx client of a live gateway (127.0.0.1, 1 MiB body limit) serving omni, answer and embed."""
    runtime = LocalRuntime({**EXECUTORS, "llm": flaky_llm})
    app = create_gateway(runtime, admin_token=TOKEN, max_request_bytes=1 << 20)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for name, source in APPS.items():
            response = client.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN)
            assert response.status_code == 201, response.text
        yield client


@pytest.fixture
def chat(gateway):
    """The official `openai` client pointed at the gateway."""
    return openai.OpenAI(base_url=f"{str(gateway.base_url).rstrip('/')}/v1", api_key="unused", max_retries=0)
