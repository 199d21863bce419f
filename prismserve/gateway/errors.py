"""Errors as data: every failure the gateway returns is `{"error": {"message", "type", "code", "request_id"}}`,
`code` being OpenAI's string where one applies (`prismserve.errors`' `code`) and null elsewhere.

`as_http_error` is the one place where an exception becomes what the client sees: the status and
type come from the error's class (`prismserve.errors`). A user error keeps its message (the client
has something to fix); a server error names only the failing component, because exception texts
carry Ray actor ids, pids, node addresses and namespaces. The full text goes to the log under the
request id that the client gets in the body and in `X-Request-Id`.
"""

from __future__ import annotations

import logging

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from prismserve.errors import DispatchError, InvalidRequestError, PrismserveError
from prismserve.protocol.errors import ErrorDetail, ErrorResponse

log = logging.getLogger(__name__)


class HTTPError(Exception):
    """An error as the client gets it: status, message, type. Made by `as_http_error` only; code
    that fails raises a class of `prismserve.errors` instead."""

    def __init__(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code

    def body(self, request_id: str) -> dict[str, object]:
        """The OpenAI-style error body, with the request id the log has the details under."""
        detail = ErrorDetail(message=self.message, type=self.kind, code=self.code, request_id=request_id)
        return ErrorResponse(error=detail).model_dump()

    def response(self, request_id: str) -> JSONResponse:
        """The JSON response for this error."""
        return JSONResponse(self.body(request_id), status_code=self.status)


def told_error(error: BaseException | None) -> PrismserveError | None:
    """The error behind `error` (itself or a cause) whose message is for the client: a user error
    such as a unit task's rejection of the request's content, wrapped or not."""
    while error is not None:
        if isinstance(error, PrismserveError) and error.public:
            return error
        error = error.__cause__
    return None


def as_http_error(
    error: BaseException, request_id: str, where: str | None = None, kind: str = "app_error"
) -> HTTPError:
    """What the client gets for `error`, raised while serving `where` (`app 'x'`; None: the gateway
    itself, whose own messages need no prefix).

    A user error gets its class's status and its message. Anything else is logged in full with the
    request id and answered with the failing component only: the class's status (a DispatchError's
    502 names its call and component), 500 of type `kind` for an exception prismserve did not type.
    """
    if isinstance(error, HTTPError):
        return error
    told = told_error(error)
    if told is not None:
        return HTTPError(told.status, f"{where}: {told}" if where else str(told), told.kind, told.code)
    place = where or "the gateway"
    log.error("request %s: %s failed: %s: %s", request_id, place, type(error).__name__, error, exc_info=error)
    see_log = f"the gateway's log has the details under request id {request_id}"
    if isinstance(error, DispatchError):
        return HTTPError(error.status, f"{place}: {error.failed_part()} failed; {see_log}", error.kind)
    if isinstance(error, PrismserveError):
        return HTTPError(error.status, f"{place} failed ({type(error).__name__}); {see_log}", error.kind)
    return HTTPError(500, f"{place} failed ({type(error).__name__}); {see_log}", kind)


def invalid(error: ValidationError | RequestValidationError, what: str = "") -> InvalidRequestError:
    """The 400 for fields that do not validate: `what` (e.g. `invalid plan: `) then pydantic's errors."""
    return InvalidRequestError(what + validation_message(error))


_NOT_HONOURED = "not supported: prismserve cannot honour this parameter, so it refuses it (leave it out)"


def validation_message(error: ValidationError | RequestValidationError) -> str:
    """pydantic's errors in one line: `field.path: message; …`."""
    parts = []
    errors = list(error.errors())
    for item in errors[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "body"
        message = _NOT_HONOURED if item["type"] == "extra_forbidden" else item["msg"]
        parts.append(f"{where}: {message}")
    more = len(errors) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
