"""DeploymentPlan: what the runtime deploys — cells of replicas, and request-static routing."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from prismserve.executors.sim import SimProfile


class CellSpec(BaseModel):
    """`count` identical cells of `gpus` GPUs, each running `replicas[name]` replicas per deployment.

    Deployment names are the app's unit-task paths (`prismserve check APP.py` lists them).
    """

    gpus: int = Field(ge=0)
    count: int = Field(default=1, ge=0)
    replicas: dict[str, int]
    throughput: float | None = None

    @model_validator(mode="after")
    def _replicas_positive(self) -> CellSpec:
        for name, n in self.replicas.items():
            if n < 0:
                raise ValueError(f"cell replicas[{name!r}] must be >= 0, got {n}")
        return self


class DeploymentPlan(BaseModel):
    """Cells to run and, per request type, the probability of each path (000 §4.3, §5.3).

    The planner's JSON output (`prismserve plan SPEC --json`) is a valid DeploymentPlan when its
    executors are named after the app's unit tasks.
    """

    cells: list[CellSpec]
    routing: dict[str, dict[str, float]] = Field(default_factory=dict)
    # Service-time profiles of `sim` executors, by deployment name.
    profiles: dict[str, SimProfile] = Field(default_factory=dict)
    gpus: int | None = None
    throughput: float | None = None

    @model_validator(mode="after")
    def _routing_sums_to_one(self) -> DeploymentPlan:
        for request_type, paths in self.routing.items():
            total = sum(paths.values())
            if any(p < 0 for p in paths.values()) or abs(total - 1.0) > 1e-6:
                raise ValueError(f"routing[{request_type!r}] must be probabilities summing to 1, got {paths}")
        return self

    @property
    def total_gpus(self) -> int:
        """GPUs the plan occupies."""
        return sum(cell.gpus * cell.count for cell in self.cells)

    def replicas(self) -> dict[str, int]:
        """Total replicas per deployment name over all cells."""
        totals: dict[str, int] = {}
        for cell in self.cells:
            for name, n in cell.replicas.items():
                totals[name] = totals.get(name, 0) + n * cell.count
        return totals
