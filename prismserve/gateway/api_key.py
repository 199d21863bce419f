"""The API key of the /v1 routes: when the gateway has one, every /v1 request must carry it.

Separate from the admin token (the admin API keeps its own, and an API key opens no admin route);
`/health`, `/metrics` and `/openapi.json` stay open, as vLLM's do.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from prismserve.errors import ApiKeyError
from prismserve.gateway.http import state
from prismserve.protocol.errors import ErrorResponse

# Declares the scheme in /openapi.json; auto_error=False: a missing key is our 401 with our error body.
_bearer = HTTPBearer(
    scheme_name="ApiKey",
    description="The gateway's API key (`create_gateway(api_key=…)`; `prismserve serve --api-key`).",
    auto_error=False,
)

UNAUTHORIZED = {401: {"model": ErrorResponse, "description": "Missing or wrong API key"}}
"""The 401 that every /v1 route documents when the gateway has an API key."""


def require_api_key(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> None:
    """401 unless the request carries the gateway's API key as a bearer token (constant-time compare)."""
    expected = state(request).api_key
    if expected is None:
        return
    if credentials is None or not credentials.credentials:
        raise ApiKeyError(
            "no API key: send it as a bearer token (Authorization: Bearer <key>; the openai client's api_key)"
        )
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise ApiKeyError("incorrect API key: send the gateway's API key as Authorization: Bearer <key>")
