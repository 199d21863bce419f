"""prismserve's log lines, with the id of the request being served (the one `X-Request-Id` gave
its client), as text or as one JSON object per line for a log collector. Which request is being
served is the caller's to say (`request_id`): this room sits below the request context."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime

FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s%(request)s: %(message)s"


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to each record: the request being served where the line was logged, as
    `request_id()` says ('' outside a request)."""

    def __init__(self, request_id: Callable[[], str]) -> None:
        super().__init__()
        self.request_id = request_id

    def filter(self, record: logging.LogRecord) -> bool:
        request = self.request_id()
        record.__dict__.update(request_id=request, request=f" [{request}]" if request else "")
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, request_id when a
    request is being served, and the exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request = getattr(record, "request_id", "")
        if request:
            line["request_id"] = request
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def setup_logging(level: str, fmt: str = "text", request_id: Callable[[], str] = str) -> logging.Handler:
    """Send prismserve's log lines at `level` and above to stderr in `fmt` (text or json), each with
    the id `request_id()` gives where it was logged; returns the handler (replacing one set up
    before)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    logger = logging.getLogger("prismserve")
    for old in [h for h in logger.handlers if getattr(h, "prismserve", False)]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.prismserve = True  # type: ignore[attr-defined]
    handler.addFilter(RequestIdFilter(request_id))
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    logger.addHandler(handler)
    logger.setLevel(level.upper().replace("TRACE", "DEBUG"))
    return handler
