"""The built-in apps, as real modules that ruff and mypy check: each family's default app
(`mllm`, `omni`, `image`) and the demo's, parametrised by one `SETTINGS` statement that
`prismserve serve MODEL` writes for the checkpoint and the engine flags."""

from prismserve.apps.default import default_app_source, engine_fields
from prismserve.apps.demo import demo_app_source
from prismserve.apps.settings import ChatAppSettings, ImageAppSettings, MLLMAppSettings, OmniAppSettings

__all__ = [
    "ChatAppSettings",
    "ImageAppSettings",
    "MLLMAppSettings",
    "OmniAppSettings",
    "default_app_source",
    "demo_app_source",
    "engine_fields",
]
