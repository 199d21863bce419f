"""The plan spec: components, deployment options (executors), request types, paths, topology."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prismserve.planner.errors import SpecError


class ExecutorOption(BaseModel):
    """A deployment option `s`: the components it runs, GPUs per replica `c_s`, profiled throughput `b_s`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    components: list[str] = Field(min_length=1)
    gpus: int = Field(ge=1)
    throughput: float  # requests/s per replica at the profiled mix

    @model_validator(mode="after")
    def _positive(self) -> ExecutorOption:
        if not self.throughput > 0:
            raise ValueError(f"executor {self.name!r}: throughput must be > 0 req/s, got {self.throughput}")
        return self


class RequestType(BaseModel):
    """A request type `t`: the components it needs and its share `π_t`; paths optional."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    components: list[str] = Field(min_length=1)
    share: float
    paths: list[list[str]] | None = None  # executor names in order; enumerated when omitted


class Node(BaseModel):
    """A machine of the cluster (topology-aware planning)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    gpus: int = Field(ge=1)


class Topology(BaseModel):
    """Nodes, inter-node bandwidth (bytes/s per node pair), and bytes per request on executor edges."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[Node] = Field(min_length=1)
    bandwidth: float = Field(gt=0)
    edge_bytes: dict[str, float] = Field(default_factory=dict)  # "E->L": bytes per request


class PlanSpec(BaseModel):
    """Everything the planner needs about a model and its workload (000 §4.1, Appendix B)."""

    model_config = ConfigDict(extra="forbid")

    components: list[str] = Field(min_length=1)  # in model order
    executors: list[ExecutorOption] = Field(min_length=1)
    request_types: list[RequestType] = Field(min_length=1)
    topology: Topology | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PlanSpec:
        known = set(self.components)
        _unique("component", self.components)
        _unique("executor", [e.name for e in self.executors])
        _unique("request type", [t.name for t in self.request_types])
        for executor in self.executors:
            unknown = sorted(set(executor.components) - known)
            if unknown:
                raise ValueError(f"executor {executor.name!r} names unknown components {unknown}")
        for request_type in self.request_types:
            unknown = sorted(set(request_type.components) - known)
            if unknown:
                raise ValueError(f"request type {request_type.name!r} names unknown components {unknown}")
            if not request_type.share > 0:
                raise ValueError(f"request type {request_type.name!r}: share must be > 0, got {request_type.share}")
        total = sum(t.share for t in self.request_types)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"request type shares must sum to 1, they sum to {total:g}")
        for component in sorted({c for e in self.executors for c in e.components}, key=self.components.index):
            if not any(e.components == [component] for e in self.executors):
                raise ValueError(
                    f"component {component!r} has no executor that runs it alone: add one with its profiled "
                    "throughput (the colocation factor of multi-component executors is measured against it)"
                )
        return self

    def executor(self, name: str) -> ExecutorOption:
        """The executor called `name`."""
        for executor in self.executors:
            if executor.name == name:
                return executor
        raise SpecError(f"unknown executor {name!r}")


def _unique(kind: str, names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{kind} {name!r} is listed twice")
        seen.add(name)


def parse_spec(data: Any) -> PlanSpec:
    """A validated spec from parsed YAML/JSON; SpecError with one line on anything wrong."""
    try:
        return PlanSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise SpecError(f"{where}: {message}" if where else message) from None


def load_spec(path: str | Path) -> PlanSpec:
    """Read a spec from a YAML or JSON file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}".splitlines()[0]) from None
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
