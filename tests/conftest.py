"""Shared test set-up: telemetry off (importing prismserve does it) before any test imports more."""

import prismserve  # noqa: F401
