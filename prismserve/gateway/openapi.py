"""The gateway's `/openapi.json`: request bodies, statuses, content types and the error body as they are.

The routes read their bodies themselves (`read_body` + `parse_json`, so that every route refuses
bad JSON, wrong Content-Types and oversized bodies alike); FastAPI therefore does not see the body
models. A route names its body with `openapi_extra=json_body(Model)` and its error statuses with
`responses=errors(...)`; `openapi_document` then moves the body models' schemas into the shared
components and drops FastAPI's default 422, which this gateway never answers (invalid fields are 400).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from prismserve.protocol.errors import ErrorResponse

_REF = "#/components/schemas/{model}"

_WHEN = {
    400: "Invalid request: malformed JSON, fields that do not validate, media that do not decode, "
    "input the app does not take",
    401: "Missing or wrong admin bearer token",
    404: "No such app (or route)",
    409: "Conflict: the name is taken, or the plan does not fit the cluster",
    413: "Body larger than the gateway's max_request_bytes",
    415: "Body not sent as JSON (Content-Type), or, for a form, not as multipart/form-data",
    500: "The app's code or the gateway failed; the log has the details under the request id",
    502: "An executor failed; the message names the call and component",
    503: "Something the deployment needs is missing (e.g. an executor environment)",
}


SSE_EVENTS = {
    "text/event-stream": {
        "schema": {
            "description": "One server-sent event: a chunk as JSON, then `[DONE]`; a failure after the "
            "status was sent ends the stream with an `error` event whose data is the error body",
            "type": "object",
            "required": ["data"],
            "properties": {"event": {"enum": ["message", "error"]}, "data": {"type": "string"}},
        }
    }
}
"""The content of a route that streams (OpenAPI 3.1: the schema describes each event)."""


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route that can answer `statuses`: each the one error body."""
    return {status: {"model": ErrorResponse, "description": _WHEN[status]} for status in statuses}


def json_body(model: type[BaseModel], description: str | None = None) -> dict[str, Any]:
    """The `openapi_extra` declaring a JSON request body of `model` (its schemas travel in `$defs`
    until `openapi_document` files them under components)."""
    schema = model.model_json_schema(ref_template=_REF)
    defs = {**schema.pop("$defs", {}), model.__name__: schema}
    body: dict[str, Any] = {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": _REF.format(model=model.__name__), "$defs": defs}}
        },
    }
    if description:
        body["description"] = description
    return {"requestBody": body}


def form_body(model: type[BaseModel], description: str | None = None) -> dict[str, Any]:
    """The `openapi_extra` declaring a multipart/form-data body of `model` (its bytes fields are files)."""
    body = json_body(model, description)
    content = body["requestBody"]["content"]
    content["multipart/form-data"] = content.pop("application/json")
    return body


def any_json_body(description: str) -> dict[str, Any]:
    """The `openapi_extra` of a JSON body whose schema depends on the app the path names."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    }


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document (built once, then cached on the app as FastAPI does)."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for operation in _operations(document):
            _file_body_schemas(operation, schemas)
            operation.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = document
    return app.openapi_schema


def allowed_methods(app: FastAPI, path: str) -> str:
    """The `Allow` header of a 405 at `path`: every documented method of a route matching it (Starlette's
    own names only the first route's, so a 405 on /admin/apps said `Allow: POST` and hid its GET)."""
    methods: set[str] = set()
    for template, operations in openapi_document(app)["paths"].items():
        if re.fullmatch(re.sub(r"\{[^/}]+\}", "[^/]+", template), path):
            methods |= {method.upper() for method in operations}
    return ", ".join(sorted(methods))


def _operations(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for path in document.get("paths", {}).values() for op in path.values() if isinstance(op, dict)]


def _file_body_schemas(operation: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Move a `json_body`'s `$defs` into the components; two different models of one name are a bug."""
    for media in operation.get("requestBody", {}).get("content", {}).values():
        for name, schema in media.get("schema", {}).pop("$defs", {}).items():
            if schemas.setdefault(name, schema) != schema:
                raise ValueError(f"two request-body schemas are both named {name!r}: rename one model")
