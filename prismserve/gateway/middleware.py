"""RequestIds: the ASGI middleware that gives each request its id and answers unexpected errors."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prismserve.gateway.errors import as_http_error
from prismserve.gateway.http import new_request_id


class RequestIds:
    """Gives each HTTP request an id (`request.state.request_id`, `X-Request-Id` on every response)
    and answers an exception no handler took with a 500 that leaves the connection usable.

    Not an `Exception` handler: Starlette runs that one in ServerErrorMiddleware, which sends the 500
    and then re-raises so that the server can log it; uvicorn then closes the connection of a
    response it saw start — without `Connection: close` — and the client's next keep-alive request
    on it fails. Here the error is logged under the request id and answered, not re-raised.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id(Headers(scope=scope).get("x-request-id", ""))
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if started:
                raise  # half a response went out: only closing the connection tells the client
            error = as_http_error(exc, request_id, kind="internal_error")
            await error.response(request_id)(scope, receive, send_with_id)
