"""RuntimeControl: what the control loops read of a running deployment, and how they change it.

The loops (re-planning, autoscaling) are typed against this, not against a runtime class: the
runtime implements it (`prismserve.runtime.Runtime`), and a test or a benchmark may give anything
that does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from prismserve.planner import CellPlan, Plan


class RuntimeControl(Protocol):
    """The running deployment as the control loops see it: plans, cells, load; and `deploy`."""

    @property
    def plans(self) -> Mapping[str, Plan]:
        """Each app's deployed plan; an app without one runs the cells it got at registration."""
        ...

    @property
    def places_cells(self) -> bool:
        """Whether this runtime places cells on a cluster's GPUs (autoscaling needs one that does)."""
        ...

    def app_cells(self, app_name: str) -> list[CellPlan]:
        """The cells the app's deployments run on now, their replicas by deployment key."""
        ...

    def gpu_count(self) -> int:
        """The GPUs this runtime may place cells on."""
        ...

    def tokens_leased(self, key: str) -> int:
        """Tokens the calls of deployment `key` have carried since it started (0: no such deployment):
        its load, as demand rather than completions."""
        ...

    def full_batch_rate(self, key: str) -> float | None:
        """Tokens/s one replica of deployment `key` serves at its full batch, where its executor
        knows it (a `sim` profile's); None otherwise."""
        ...

    async def deploy(self, app_name: str, plan: Plan) -> None:
        """Apply `plan` to the app's deployments, changing only what differs, losing no request."""
        ...
