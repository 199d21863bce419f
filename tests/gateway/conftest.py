"""Fixtures of the gateway tests: a gateway over an in-process runtime with the test apps registered,
one per module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import openai
import pytest
from gateway_apps import ADMIN, APPS, TOKEN, flaky_llm
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime


@contextlib.contextmanager
def _started(serve_gateway) -> Iterator[httpx.Client]:
    runtime = LocalRuntime({**EXECUTORS, "llm": flaky_llm})
    app = create_gateway(runtime, admin_token=TOKEN, max_request_bytes=1 << 20)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        _register(client, APPS)
        yield client


def _register(client: httpx.Client, apps: dict[str, str]) -> None:
    for name, source in apps.items():
        response = client.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN)
        assert response.status_code == 201, response.text


def _reset_apps(client: httpx.Client) -> None:
    """Registered again, in order, if a test registered or unregistered any: as the test found them."""
    listed = client.get("/admin/apps", headers=ADMIN).json()["apps"]
    if [app["name"] for app in listed] != list(APPS):
        for app in listed:
            assert client.delete(f"/admin/apps/{app['name']}", headers=ADMIN).is_success
        _register(client, APPS)


@pytest.fixture(scope="module")
def module_gateway(serve_gateway) -> Iterator[httpx.Client]:
    """The gateway the tests of a module share (see `gateway`)."""
    with _started(serve_gateway) as client:
        yield client


@pytest.fixture
def gateway(request, serve_gateway) -> Iterator[httpx.Client]:
    """An httpx client of a live gateway (127.0.0.1, 1 MiB body limit) serving omni, answer and embed:
    the module's, its apps registered as at the start; a gateway of its own for a test marked
    `fresh_gateway` (one that reads state its module's tests add to: metrics, plans)."""
    if request.node.get_closest_marker("fresh_gateway") is not None:
        with _started(serve_gateway) as client:
            yield client
        return
    client = request.getfixturevalue("module_gateway")
    yield client
    _reset_apps(client)


@pytest.fixture
def chat(gateway):
    """The official `openai` client pointed at the gateway."""
    return openai.OpenAI(base_url=f"{str(gateway.base_url).rstrip('/')}/v1", api_key="unused", max_retries=0)
