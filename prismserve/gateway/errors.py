"""Errors as data: every failure the gateway returns is `{"error": {"message", "type", "code", "request_id"}}`.

`as_http_error` is the one place where an exception becomes what the client sees. A 4xx keeps its
message (the client has something to fix); a 5xx names only the failing component, because
exception texts carry Ray actor ids, pids, node addresses and namespaces. The full text goes to the
log under the request id that the client gets in the body and in `X-Request-Id`.
"""

from __future__ import annotations

import logging
import re

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from prismserve.task import DispatchError, InvalidInputError

log = logging.getLogger(__name__)

# The dispatchers name a failed call `call #<index> (<unit-task class>)` at the start of their message.
_FAILED_CALL = re.compile(r"^call #\d+ \([\w.]+\)")


class HTTPError(Exception):
    """An error with the HTTP status and message the client gets."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self, request_id: str) -> dict[str, object]:
        """The OpenAI-style error body, with the request id the log has the details under."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.status,
                "request_id": request_id,
            }
        }

    def response(self, request_id: str) -> JSONResponse:
        """The JSON response for this error."""
        return JSONResponse(self.body(request_id), status_code=self.status)


def rejected_input(error: BaseException | None) -> InvalidInputError | None:
    """The InvalidInputError behind `error` (itself or a cause), if a unit task rejected the request's content."""
    while error is not None:
        if isinstance(error, InvalidInputError):
            return error
        error = error.__cause__
    return None


def as_http_error(error: BaseException, request_id: str, where: str, kind: str = "app_error") -> HTTPError:
    """What the client gets for `error`, raised while serving `where` (`app 'x'`, `the gateway`).

    An HTTPError stays as it is; a rejected input is a 400 with its message; anything else is
    logged in full with the request id and answered with the failing component only: a 502 for an
    executor's failure, a 500 (`kind`) for the rest.
    """
    if isinstance(error, HTTPError):
        return error
    rejected = rejected_input(error)
    if rejected is not None:
        return HTTPError(400, f"{where}: {rejected}", "invalid_input")
    log.error("request %s: %s failed: %s: %s", request_id, where, type(error).__name__, error, exc_info=error)
    see_log = f"the gateway's log has the details under request id {request_id}"
    if isinstance(error, DispatchError):
        call = _FAILED_CALL.match(str(error))
        return HTTPError(
            502, f"{where}: {call[0] if call else 'an executor'} failed; {see_log}", "executor_error"
        )
    return HTTPError(500, f"{where} failed ({type(error).__name__}); {see_log}", kind)


def validation_message(error: ValidationError | RequestValidationError) -> str:
    """pydantic's errors in one line: `field.path: message; …`."""
    parts = []
    errors = list(error.errors())
    for item in errors[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "body"
        parts.append(f"{where}: {item['msg']}")
    more = len(errors) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
