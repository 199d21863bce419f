"""Errors as data: every failure the gateway returns is `{"error": {"message", "type", "code"}}`."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError


class HTTPError(Exception):
    """An error with the HTTP status and message the client gets."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def response(self) -> JSONResponse:
        """The JSON response for this error."""
        return error_response(self.status, self.message, self.kind)


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def validation_message(error: ValidationError | RequestValidationError) -> str:
    """pydantic's errors in one line: `field.path: message; …`."""
    parts = []
    errors = list(error.errors())
    for item in errors[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "body"
        parts.append(f"{where}: {item['msg']}")
    more = len(errors) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
