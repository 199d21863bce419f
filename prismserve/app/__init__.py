"""Apps: one Python file with a `Config` class deriving from `AppConfig` and `async def serve(request)`
(002 §2.2); its parameters, if any, in one `SETTINGS` statement (`AppSettings`)."""

from prismserve.app.app import App
from prismserve.app.config import SLO, AppConfig, Autoscale
from prismserve.app.loader import AppLoadError, load_app, load_app_source
from prismserve.app.registry import AppRegistry, AppRegistryError, Deployment
from prismserve.app.settings import AppSettings, app_module_source

__all__ = [
    "App",
    "AppConfig",
    "AppLoadError",
    "AppRegistry",
    "AppRegistryError",
    "AppSettings",
    "Autoscale",
    "Deployment",
    "SLO",
    "app_module_source",
    "load_app",
    "load_app_source",
]
