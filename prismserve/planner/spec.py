"""The plan spec: components, deployment options, request types, paths, topology.

A deployment option (000 §4: a planner node) is what the planner places and routes through; the
engines that serve a unit task on a replica are executors (`prismserve.executors`), another thing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prismserve.planner.errors import SpecError
from prismserve.planner.stage_batching import StageCosts


class DeploymentOption(BaseModel):
    """A deployment option `s`: the components it runs, GPUs per replica `c_s`, profiled throughput `b_s`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    components: list[str] = Field(min_length=1)
    gpus: int = Field(ge=1)
    throughput: float  # requests/s per replica at the profiled mix
    # Optional measured times that replace Algorithm 3's estimate: request type -> role -> replica
    # seconds per request of that type when this option runs that role ("P+D": components joined
    # by "+" in model order). Algorithm 3's one colocation factor per option cannot tell that a
    # colocated option running only part of its components may be slower per component.
    role_seconds: dict[str, dict[str, float]] = Field(default_factory=dict)
    # False: a solo profile of one component, there only to give Algorithm 3 its time τ_c; the
    # planner never deploys it nor routes through it (e.g. an encoder too small to run alone).
    deployable: bool = True
    # True: a request may visit it more than once, each time for the next block of its components
    # (TriInfer's ED: encode, then decode once prefill ran elsewhere); False: 000's rule, it runs
    # everything it holds that is still to run (docs/planner.md, "Valid paths").
    separable: bool = False

    @model_validator(mode="after")
    def _positive(self) -> DeploymentOption:
        if not (self.throughput > 0 and math.isfinite(self.throughput)):
            raise ValueError(
                f"option {self.name!r}: throughput must be a finite number > 0 req/s, got {self.throughput}"
            )
        if "->" in self.name:
            raise ValueError(
                f"option {self.name!r}: names may not contain '->', which joins options in path names"
            )
        _unique(f"option {self.name!r}: component", self.components)
        if not self.deployable and len(self.components) > 1:
            raise ValueError(
                f"option {self.name!r}: `deployable: false` marks a solo profile of one component, "
                f"but it runs {self.components}; make it deployable or remove it"
            )
        for request_type, roles in self.role_seconds.items():
            for role, seconds in roles.items():
                unknown = sorted(set(role.split("+")) - set(self.components))
                if unknown:
                    raise ValueError(
                        f"option {self.name!r}: role_seconds[{request_type!r}][{role!r}] names components {unknown} it does not run"
                    )
                if not (seconds > 0 and math.isfinite(seconds)):
                    raise ValueError(
                        f"option {self.name!r}: role_seconds[{request_type!r}][{role!r}] must be > 0 s, got {seconds}"
                    )
        return self


class RequestType(BaseModel):
    """A request type `t`: the components it needs and its share `π_t`; paths optional."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    components: list[str] = Field(min_length=1)
    share: float
    paths: list[list[str]] | None = None  # option names in order; enumerated when omitted

    @model_validator(mode="after")
    def _well_formed(self) -> RequestType:
        _unique(f"request type {self.name!r}: component", self.components)
        if self.paths is not None:
            if not self.paths:
                raise ValueError(
                    f"request type {self.name!r}: `paths` is empty; list at least one or omit it"
                )
            _unique(f"request type {self.name!r}: path", ["->".join(p) for p in self.paths])
        return self


class Node(BaseModel):
    """A machine of the cluster (topology-aware planning) and its GPU count."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    gpus: int = Field(ge=1)


class Link(BaseModel):
    """Bandwidth (bytes/s, each direction) between two nodes, overriding the topology's default."""

    model_config = ConfigDict(extra="forbid")

    nodes: tuple[str, str]
    bandwidth: float = Field(ge=0)


class Topology(BaseModel):
    """Nodes, inter-node bandwidth, and bytes per request on the edges between options (000 Appendix A)."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[Node] = Field(min_length=1)
    bandwidth: float = Field(
        ge=0
    )  # bytes/s in each direction between any two nodes, unless `links` says otherwise
    links: list[Link] = Field(default_factory=list)
    edge_bytes: dict[str, float] = Field(default_factory=dict)  # "E->L": bytes per request sent from E to L

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        names = [n.name for n in self.nodes]
        _unique("node", names)
        for link in self.links:
            unknown = sorted(set(link.nodes) - set(names))
            if unknown:
                raise ValueError(f"link {link.nodes[0]}-{link.nodes[1]} names unknown nodes {unknown}")
            if link.nodes[0] == link.nodes[1]:
                raise ValueError(f"link {link.nodes[0]}-{link.nodes[1]} must join two different nodes")
        for edge, size in self.edge_bytes.items():
            if len(edge.split("->")) != 2:
                raise ValueError(f"edge_bytes key {edge!r} must be two option names joined by '->'")
            if not (size >= 0 and math.isfinite(size)):
                raise ValueError(f"edge_bytes[{edge!r}] must be a finite number >= 0, got {size}")
        return self

    def bandwidth_between(self, a: str, b: str) -> float:
        """Bytes/s from node `a` to node `b`."""
        for link in self.links:
            if set(link.nodes) == {a, b}:
                return link.bandwidth
        return self.bandwidth


class Host(BaseModel):
    """The CPUs every replica shares, when all of them run on one machine's CPU (GPUs declared on a
    CPU-only machine): whatever the replicas, the machine serves at most `cpus` CPU-seconds a second.

    `seconds[type]`: CPU-seconds the machine spends on one request of that type (every process:
    replicas, gateway), measured by the profiler."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(gt=0)
    seconds: dict[str, float] = Field(min_length=1)

    @model_validator(mode="after")
    def _positive(self) -> Host:
        for request_type, seconds in self.seconds.items():
            if not (seconds > 0 and math.isfinite(seconds)):
                raise ValueError(f"host.seconds[{request_type!r}] must be a finite number > 0, got {seconds}")
        return self


class PlanSpec(BaseModel):
    """Everything the planner needs about a model and its workload (000 §4.1, Appendix B)."""

    model_config = ConfigDict(extra="forbid")

    components: list[str] = Field(min_length=1)  # in model order
    options: list[DeploymentOption] = Field(min_length=1)
    request_types: list[RequestType] = Field(min_length=1)
    topology: Topology | None = None
    # GPUs of the largest cell (a power of two); the planner's default when none is given.
    max_cell_gpus: int | None = Field(default=None, ge=1, le=4096)
    host: Host | None = None  # replicas sharing one machine's CPUs cap the rate
    # Per-instance iteration latencies and SLOs (TriInfer): what `plan --by-replay` replays a trace with.
    stages: StageCosts | None = None

    @model_validator(mode="before")
    @classmethod
    def _lists_from_mappings(cls, data: Any) -> Any:
        """`options` and `request_types` may be written `{name: fields}`: the planner sees lists.
        A spec of an earlier version (a cached profile) names its options `executors`."""
        data = renamed_key(data, "executors", "options")
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in ("options", "request_types"):
            if isinstance(data.get(key), dict):
                data[key] = [_named(key, name, fields) for name, fields in data[key].items()]
        return data

    @model_validator(mode="after")
    def _consistent(self) -> PlanSpec:
        known = set(self.components)
        _unique("component", self.components)
        _unique("option", [o.name for o in self.options])
        _unique("request type", [t.name for t in self.request_types])
        for option in self.options:
            unknown = sorted(set(option.components) - known)
            if unknown:
                raise ValueError(f"option {option.name!r} names unknown components {unknown}")
        options = {o.name for o in self.options}
        solo_only = {o.name for o in self.options if not o.deployable}
        for request_type in self.request_types:
            unknown = sorted(set(request_type.components) - known)
            if unknown:
                raise ValueError(f"request type {request_type.name!r} names unknown components {unknown}")
            if not (request_type.share > 0 and math.isfinite(request_type.share)):
                raise ValueError(
                    f"request type {request_type.name!r}: share must be > 0, got {request_type.share}"
                )
            for path in request_type.paths or []:
                unknown = sorted(set(path) - options)
                if unknown:
                    raise ValueError(
                        f"request type {request_type.name!r}: path names unknown options {unknown}"
                    )
                named = sorted(set(path) & solo_only)
                if named:
                    raise ValueError(
                        f"request type {request_type.name!r}: path {'->'.join(path)} runs {named}, marked "
                        "`deployable: false` (a solo profile only); remove the path or make them deployable"
                    )
        self._normalise_shares()
        if self.max_cell_gpus is not None and self.max_cell_gpus & (self.max_cell_gpus - 1):
            below = 1 << (self.max_cell_gpus.bit_length() - 1)
            raise ValueError(
                f"max_cell_gpus must be a power of two (the largest cell's GPUs), got {self.max_cell_gpus}; "
                f"use {below} or {2 * below}"
            )
        # Algorithm 3 derives τ_c from the option that runs c alone; without it there is nothing
        # to measure a colocated option's factor α_s against (papers/NOTES.md). A component no
        # request type needs costs nothing on any path, so it needs no τ_c (an encoder of video in
        # a colocated option, planned for a mix without video).
        needed = {c for t in self.request_types for c in t.components}
        for component in sorted(
            {c for o in self.options for c in o.components} & needed, key=self.components.index
        ):
            if not any(o.components == [component] for o in self.options):
                raise ValueError(
                    f"component {component!r} has no option that runs it alone: add one with its profiled "
                    "throughput (the colocation factor of multi-component options is measured against it)"
                )
        if self.topology is not None:
            for edge in self.topology.edge_bytes:
                unknown = sorted(set(edge.split("->")) - options)
                if unknown:
                    raise ValueError(f"topology.edge_bytes key {edge!r} names unknown options {unknown}")
        if self.host is not None:
            names = {t.name for t in self.request_types}
            unknown, missing = sorted(set(self.host.seconds) - names), sorted(names - set(self.host.seconds))
            if unknown or missing:
                raise ValueError(
                    "host.seconds must give every request type's CPU-seconds: "
                    + (f"unknown {unknown}" if unknown else f"missing {missing}")
                )
        return self

    def _normalise_shares(self) -> None:
        """Shares may be raw counts (30 and 70): π_t is each one's fraction of their sum."""
        total = sum(t.share for t in self.request_types)
        if not math.isfinite(total):
            raise ValueError("request type shares overflow when added; give them as fractions or counts")
        if total != 1.0:
            self.request_types = [t.model_copy(update={"share": t.share / total}) for t in self.request_types]

    def deployable_options(self) -> list[DeploymentOption]:
        """The options a plan may run; `deployable: false` ones only give Algorithm 3 a solo time."""
        return [o for o in self.options if o.deployable]

    def host_capacity(self) -> float | None:
        """Requests/s of the mix the shared CPUs sustain (`host`), or None when replicas share none."""
        if self.host is None:
            return None
        return self.host.cpus / sum(t.share * self.host.seconds.get(t.name, 0.0) for t in self.request_types)

    def option(self, name: str) -> DeploymentOption:
        """The option called `name`."""
        for option in self.options:
            if option.name == name:
                return option
        raise SpecError(f"unknown option {name!r}")


def renamed_key(data: Any, old: str, new: str) -> Any:
    """`data` with key `old` read as `new`: files an earlier version wrote (cached profiles, users'
    specs and plans) still load. Both given is ambiguous: which one was meant cannot be told."""
    if not isinstance(data, dict) or old not in data:
        return data
    if new in data:
        raise ValueError(
            f"both `{new}` and `{old}` are given; `{old}` is the old name of `{new}`: keep only `{new}`"
        )
    return {new if key == old else key: value for key, value in data.items()}


def _named(key: str, name: Any, fields: Any) -> Any:
    """One entry of a `{name: fields}` mapping as a list entry; a `name` field must agree with the key."""
    if not isinstance(fields, dict):
        raise ValueError(
            f"{key}.{name}: give its fields as a mapping (components, ...), got {type(fields).__name__}"
        )
    if "name" in fields and fields["name"] != name:
        raise ValueError(
            f"{key}.{name}: `name: {fields['name']}` disagrees with its key; drop `name` or make them equal"
        )
    return {**fields, "name": name}


def _unique(kind: str, names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{kind} {name!r} is listed twice")
        seen.add(name)


def parse_spec(data: Any) -> PlanSpec:
    """A validated spec from parsed YAML/JSON; SpecError with one line on anything wrong."""
    if not isinstance(data, dict):
        raise SpecError(
            f"a plan spec is a mapping with `components`, `options` and `request_types`, got {type(data).__name__}"
        )
    try:
        return PlanSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = " ".join(first["msg"].removeprefix("Value error, ").split())
        raise SpecError(f"{where}: {message}" if where else message) from None


def load_spec(path: str | Path) -> PlanSpec:
    """Read a spec from a YAML or JSON file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {kind}: {' '.join(str(exc).split())}") from None
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
