"""Periodic: a watcher the gateway runs beside serving, checking every `interval_s`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from typing import Any

log = logging.getLogger(__name__)


class Periodic(ABC):
    """Runs `check()` every `interval_s` in the running event loop, from `start()` until `close()`;
    a check that fails is logged (as `what` failed) and the next one runs, so that a watcher never
    stops by accident."""

    interval_s: float
    what: str = "a periodic check"
    _task: asyncio.Task[None] | None = None

    @abstractmethod
    async def check(self) -> Any:
        """One look at the traffic, acting on it if called for."""

    def start(self) -> None:
        """Check every `interval_s` in the running event loop, until `close()`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop checking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - a failed check must not stop the next ones
                log.exception("%s failed; trying again in %.0f s", self.what, self.interval_s)
