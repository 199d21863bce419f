"""What the admin API changed, kept in a file so that it survives a restart of the gateway.

The apps registered through `POST /admin/apps` (their source) and the plans posted through
`POST /admin/apps/{name}/plan` are written to the state file (`serve --state FILE`) as they change,
and re-registered and deployed when a server starts with the same file. The app given on the command
line is the command line's: only a plan posted for it is kept. The file is JSON, replaced atomically
(written beside it, then renamed over it), so a crash never leaves half of it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prismserve.control import Plan

if TYPE_CHECKING:
    from prismserve.control import Controls
    from prismserve.runtime import Runtime

log = logging.getLogger(__name__)
VERSION = 1


class DurableState:
    """The admin API's changes in `path` (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.apps: dict[str, str] = {}  # name -> source, of apps registered through the admin API
        self.plans: dict[str, dict[str, Any]] = {}  # name -> plan posted
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}, this server writes {VERSION}")
            self.apps, self.plans = dict(data["apps"]), dict(data["plans"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"state file {self.path} cannot be read: {exc}; move it away to start afresh"
            ) from None

    def _write(self) -> None:
        data = {"version": VERSION, "apps": self.apps, "plans": self.plans}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)

    def app_registered(self, name: str, source: str) -> None:
        self.apps[name] = source
        self._write()

    def app_unregistered(self, name: str) -> None:
        self.apps.pop(name, None)
        self.plans.pop(name, None)
        self._write()

    def plan_posted(self, name: str, plan: Plan) -> None:
        self.plans[name] = plan.model_dump(mode="json")
        self._write()

    async def restore(self, runtime: Runtime, controls: Controls) -> list[str]:
        """Register the kept apps not registered yet and deploy the kept plans (as posted: the app's
        re-planning stops); returns the apps restored. One that fails is logged and kept in the file,
        and the others still restore: the server serves what it can."""
        restored = []
        for name in sorted(set(self.apps) | set(self.plans)):
            try:
                if name not in runtime.registry.apps and name in self.apps:
                    controls.registered(
                        await runtime.register_app(self.apps[name], name, filename=f"{name}.py")
                    )
                if name in self.plans and name in runtime.registry.apps:
                    await controls.plan_posted(name)
                    await runtime.deploy(name, Plan.model_validate(self.plans[name]))
            except Exception as exc:  # noqa: BLE001  (any failure of one app's restore is that app's)
                log.error("app %r from %s not restored: %s", name, self.path, exc)
                continue
            restored.append(name)
        return restored
