"""AppRegistry: the registered apps and the unit-task deployments they share (002 §2.2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prismserve.app.app import App
from prismserve.errors import AppExistsError, UnknownAppError
from prismserve.errors import AppRegistryError as AppRegistryError  # its users import it from here
from prismserve.task import UnitTask


@dataclass
class Deployment:
    """One unit-task deployment (an equivalence class of unit tasks) and the apps that use it."""

    key: str
    task: UnitTask[Any, Any]
    apps: set[str] = field(default_factory=set)


class AppRegistry:
    """Apps by name; equivalent unit tasks of all apps share one `Deployment`."""

    def __init__(self) -> None:
        self._apps: dict[str, App] = {}
        self._deployments: dict[str, Deployment] = {}

    def register(self, app: App) -> list[Deployment]:
        """Add an app; returns the deployments it needs that did not exist before."""
        if app.name in self._apps:
            raise AppExistsError(f"an app named {app.name!r} is already registered; unregister it first")
        self._apps[app.name] = app
        new = []
        for key, task in app.unit_tasks().items():
            deployment = self._deployments.get(key)
            if deployment is None:
                deployment = self._deployments[key] = Deployment(key, task)
                new.append(deployment)
            deployment.apps.add(app.name)
        return new

    def share(self, app_name: str, task: UnitTask[Any, Any]) -> None:
        """Let app `app_name` use `task`'s deployment too (a plan runs it at another GPU shape), so that
        it stays up while the app is registered and is released with it."""
        key = task.deployment_key()
        self._deployments.setdefault(key, Deployment(key, task)).apps.add(app_name)

    def unregister(self, name: str) -> list[Deployment]:
        """Remove an app; returns the deployments no remaining app uses."""
        if name not in self._apps:
            raise UnknownAppError(f"no app named {name!r} is registered")
        del self._apps[name]
        released = []
        for key, deployment in list(self._deployments.items()):
            deployment.apps.discard(name)
            if not deployment.apps:
                released.append(self._deployments.pop(key))
        return released

    def find(self, name: str) -> App | None:
        """The app called `name`, or None."""
        return self._apps.get(name)

    def get(self, name: str) -> App:
        """The app called `name`."""
        try:
            return self._apps[name]
        except KeyError:
            raise UnknownAppError(f"no app named {name!r}; registered: {sorted(self._apps)}") from None

    @property
    def apps(self) -> dict[str, App]:
        """Registered apps by name."""
        return dict(self._apps)

    @property
    def deployments(self) -> dict[str, Deployment]:
        """Unit-task deployments by deployment key."""
        return dict(self._deployments)
