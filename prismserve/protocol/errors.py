"""The one error body every route answers with: OpenAI's shape, so its client raises the matching error."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    """What failed, in words the client can act on, and where the server's log has the rest."""

    message: str = Field(description="What went wrong; for a 4xx, what to change.")
    type: str = Field(
        description="The error's kind: invalid_request_error, not_found_error, executor_error …"
    )
    code: str | None = Field(
        description="OpenAI's error code where one applies (`invalid_api_key`, `model_not_found`, "
        "`context_length_exceeded`), else null; the status is the response's."
    )
    request_id: str = Field(description="The request's id, as in the X-Request-Id header and the log.")


class ErrorResponse(BaseModel):
    """The body of every error response, and the data of a stream's closing `error` event."""

    error: ErrorDetail
