"""Inference API: POST /v1/apps/{app}/invoke — JSON in, JSON out (or SSE when the app streams)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from prismserve.gateway.http import json_of, read_body, sse_chunks
from prismserve.gateway.openapi import SSE_EVENTS, any_json_body, errors
from prismserve.gateway.serving import find_app, parse_request, serving

router = APIRouter()


@router.post(
    "/v1/apps/{name:path}/invoke",
    openapi_extra=any_json_body(
        "The app's request type as JSON (bytes fields as base64); GET /admin/apps names each app's type"
    ),
    responses={
        200: {
            "description": "The app's response type as JSON; a streaming app answers server-sent events, "
            "one `data: <chunk JSON>` per chunk, then `data: [DONE]` (or an `error` event)",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                **SSE_EVENTS,
            },
        },
        **errors(400, 404, 413, 415, 500, 502),
    },
)
async def invoke(name: str, request: Request) -> Response:
    """Run the app's serve() on the body (its request type as JSON; bytes fields as base64)."""
    app = find_app(request.app.state.gateway.runtime, name)
    served = serving(request, app, parse_request(app, await read_body(request)))
    if not app.streaming:
        result = await served.response()
        return Response(json_of(result), media_type="application/json")
    chunks = served.chunks()
    first = await anext(chunks, None)  # errors before the first chunk get a proper status code
    events = sse_chunks(first, chunks, served.request_id, served.failure)
    return StreamingResponse(events, media_type="text/event-stream")
