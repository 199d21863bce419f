"""prismserve's log lines carry the id of the request being served (observability/logs.py)."""

from __future__ import annotations

import json
import logging

import pytest

from prismserve.observability import setup_logging
from prismserve.task.context import RequestContext, current_request, use_request


@pytest.fixture
def logged(capsys):
    """Set up prismserve's logging as `serve` does, and undo it after."""
    logger = logging.getLogger("prismserve")
    level = logger.level

    def lines(fmt: str, log) -> list[str]:
        handler = setup_logging("info", fmt, lambda: current_request().id)
        try:
            log(logging.getLogger("prismserve.gateway.serving"))
        finally:
            logger.removeHandler(handler)
        return capsys.readouterr().err.splitlines()

    yield lines
    logger.setLevel(level)


def test_json_lines_carry_the_request_id_and_the_traceback(logged):
    def log(logger):
        logger.info("outside a request")
        with use_request(RequestContext(id="req-7")):
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                logger.exception("failed")

    outside, failed = map(json.loads, logged("json", log))
    assert outside["message"] == "outside a request" and "request_id" not in outside
    assert failed["request_id"] == "req-7" and failed["level"] == "ERROR"
    assert failed["logger"] == "prismserve.gateway.serving" and "RuntimeError: boom" in failed["exception"]


def test_text_lines_name_the_request_in_brackets(logged):
    def log(logger):
        with use_request(RequestContext(id="req-8")):
            logger.warning("slow replica")
        logger.debug("below the level")

    (line,) = logged("text", log)
    assert line.endswith("WARNING prismserve.gateway.serving [req-8]: slow replica")
