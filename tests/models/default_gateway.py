"""A gateway serving a tiny model's default app, in process (the tests that drive a real model
through the HTTP API)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def default_app_gateway(serve_gateway, model: str, name: str, source: str | None = None) -> Iterator[str]:
    """The URL of a gateway (in-process runtime) serving `model`'s default app (or the app `source`)
    as `name`."""
    import httpx

    from prismserve.apps import default_app_source
    from prismserve.gateway import create_gateway
    from prismserve.models import family_for
    from prismserve.runtime import LocalRuntime

    token = "default-app"
    app = create_gateway(LocalRuntime(), admin_token=token, max_request_bytes=1 << 20)
    with serve_gateway(app) as url:
        registered = httpx.post(
            f"{url}/admin/apps",
            json={"name": name, "source": source or default_app_source(family_for(model), model)},
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
        )
        assert registered.status_code == 201, registered.text
        yield url
