"""AppConfig: what an app file declares about itself."""

from __future__ import annotations

from typing import Any, ClassVar


class AppConfig:
    """Subclass as `class Config(AppConfig)` in an app file and list its tasks by name.

    `tasks` maps a name to each task the app's serve() calls; the unit tasks reachable from them
    are what gets deployed (equivalent unit tasks are deployed once, across apps too).
    """

    tasks: ClassVar[dict[str, Any]] = {}
