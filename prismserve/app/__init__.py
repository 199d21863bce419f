"""Apps: one Python file with `class Config(AppConfig)` and `async def serve(request)` (002 §2.2)."""

from prismserve.app.app import App
from prismserve.app.config import SLO, AppConfig, Autoscale
from prismserve.app.loader import AppLoadError, load_app, load_app_source
from prismserve.app.registry import AppRegistry, AppRegistryError, Deployment

__all__ = [
    "App",
    "AppConfig",
    "AppLoadError",
    "AppRegistry",
    "AppRegistryError",
    "Autoscale",
    "Deployment",
    "SLO",
    "load_app",
    "load_app_source",
]
