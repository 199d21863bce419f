"""The gateway against its own /openapi.json: schemathesis generates requests for every route from the
document and checks that no answer is a 5xx and that every answer's status, content type and body
are the ones documented. A short run (a few examples per route) keeps it CI-sized."""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from gateway_apps import ADMIN, APPS, TOKEN
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance
from toy.executors import EXECUTORS

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime

pytestmark = pytest.mark.reliability

EXAMPLES = int(os.environ.get("PRISMSERVE_SCHEMATHESIS_EXAMPLES", "15"))
"""Examples per route: CI-sized; set the variable for a longer hunt."""

# Every check (no 5xx; statuses, content types, bodies and headers as documented; bodies that break
# the schema refused; Allow on a 405) but one: a schema-valid app source may still not load (400).
SKIPPED = [positive_data_acceptance]


@pytest.fixture(scope="module")
def gateway_url(serve_gateway):
    """A live gateway (the toy omni, answer and embed apps on the in-process runtime) for the module."""
    app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, max_request_bytes=1 << 20)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for name, source in APPS.items():
            assert client.post("/admin/apps", json={"name": name, "source": source}, headers=ADMIN).is_success
        yield url


@pytest.fixture(scope="module")
def api_schema(gateway_url):
    """The gateway's own OpenAPI document, as schemathesis loads it."""
    return schemathesis.openapi.from_url(f"{gateway_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
def test_every_route_answers_as_its_openapi_document_says(case, gateway_url):
    case.call_and_validate(base_url=gateway_url, headers=ADMIN, excluded_checks=SKIPPED)
