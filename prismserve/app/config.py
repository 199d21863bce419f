"""AppConfig: what an app file declares about itself."""

from __future__ import annotations

from typing import Any, ClassVar


class AppConfig:
    """Subclass as `class Config(AppConfig)` in an app file and list its tasks by name.

    `tasks` maps a name to each task the app's serve() calls; the unit tasks reachable from them
    are what gets deployed (equivalent unit tasks are deployed once, across apps too).
    `input_modalities` (text, image, audio, video) and `output_modalities` (text, audio) say what
    a chat app accepts and produces. `sim_values` maps a unit-task class to the function that
    computes its outputs when it runs on a `sim` executor (apps without weights, such as the tests'
    toys); other `sim` outputs are synthesised from the output type.
    """

    tasks: ClassVar[dict[str, Any]] = {}
    # What chat requests may carry and ask for; the gateway refuses others with a 4xx.
    input_modalities: ClassVar[frozenset[str]] = frozenset({"text"})
    output_modalities: ClassVar[frozenset[str]] = frozenset({"text"})
    sim_values: ClassVar[dict[type, Any]] = {}
