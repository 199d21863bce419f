"""Controls: the control loops of one serving process, by app, as the gateway feeds and shows them."""

from __future__ import annotations

import logging

from prismserve.app import App
from prismserve.control.autoscale import Autoscaler
from prismserve.control.replan import Replanner
from prismserve.control.runtime_control import RuntimeControl
from prismserve.control.slo import SLOWindow

log = logging.getLogger(__name__)


class Controls:
    """Per app: its re-planning watcher (`serve --gpus`), its autoscaler (`Config.autoscale`) and
    the window of its SLO outcomes. The gateway reports each request's type and SLO outcome here
    and shows the loops' state in /metrics; the loops change the deployment through `runtime`."""

    def __init__(self, runtime: RuntimeControl) -> None:
        self.runtime = runtime
        self.replanners: dict[str, Replanner] = {}
        self.autoscalers: dict[str, Autoscaler] = {}
        self.slo_windows: dict[str, SLOWindow] = {}

    def observe(self, app_name: str, request_type: str) -> None:
        """Count a request arriving for the app's re-planning watcher, if it has one."""
        replanner = self.replanners.get(app_name)
        if replanner is not None:
            replanner.observe(request_type)

    def slo_window(self, app_name: str) -> SLOWindow:
        """The app's sliding window of SLO outcomes (made on first use)."""
        window = self.slo_windows.get(app_name)
        if window is None:
            window = self.slo_windows[app_name] = SLOWindow()
        return window

    def watch(self, replanner: Replanner) -> None:
        """Feed `replanner` every request of its app and show its state; start it with `start()`
        in the serving event loop."""
        self.replanners[replanner.app_name] = replanner

    def registered(self, app: App) -> Autoscaler | None:
        """Start autoscaling a newly registered app if it asks for it; None when it does not, or
        the runtime places no cells (logged)."""
        if app.autoscale is None:
            return None
        if not self.runtime.places_cells:
            log.warning(
                "app %s asks for autoscaling, which needs the Ray runtime: serving it unscaled", app.name
            )
            return None
        scaler = self.autoscalers[app.name] = Autoscaler(self.runtime, app, self.slo_window(app.name))
        scaler.start()
        return scaler

    async def unregistered(self, app_name: str) -> None:
        """Stop the loops of an app that is no longer served."""
        for loops in (self.autoscalers, self.replanners):
            loop = loops.pop(app_name, None)
            if loop is not None:
                await loop.close()

    async def plan_posted(self, app_name: str) -> None:
        """A plan given by hand takes over from re-planning: the app's watcher stops."""
        watcher = self.replanners.pop(app_name, None)
        if watcher is not None:
            await watcher.close()
            log.warning("a plan was posted for %s: re-planning it stops", app_name)

    async def close(self) -> None:
        """Stop every loop."""
        for loop in [*self.replanners.values(), *self.autoscalers.values()]:
            await loop.close()
        self.replanners.clear()
        self.autoscalers.clear()
