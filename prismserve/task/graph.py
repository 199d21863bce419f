"""TaskGraph: the unit-task invocations one request makes and the data that flows between them."""

from __future__ import annotations

import base64
import importlib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from prismserve.task.data import DataHandle, Stream, accepting_placeholders
from prismserve.task.errors import TaskError

GRAPH_FORMAT_VERSION = 1


def data_id(producer: int, field_name: str | None = None) -> str:
    """The id of a unit-task output (or of one of its fields) inside a graph."""
    return str(producer) if field_name is None else f"{producer}.{field_name}"


def producer_of(data: str) -> int:
    """The index of the invocation that produces the data with this id."""
    return int(data.partition(".")[0])


def output_value(outputs: Sequence[Any], data: str) -> Any:
    """The real value named by a data id, taken from the invocations' outputs."""
    producer, _, field_name = data.partition(".")
    output = outputs[int(producer)]
    return getattr(output, field_name) if field_name else output


@dataclass(frozen=True, slots=True)
class Edge:
    """A data dependency: invocation `dst` consumes data `data` produced by invocation `src`."""

    src: int
    dst: int
    data: str


@dataclass(slots=True, eq=False)
class Invocation:
    """One call of a unit task: the task, its input (placeholders where data comes from other calls)."""

    index: int
    task: Any  # a UnitTask; typed loosely so that the graph does not import the task classes
    input: BaseModel
    deps: dict[str, int] = field(default_factory=dict)  # data id -> producing invocation

    @property
    def task_key(self) -> str:
        """Deployment key of the invoked unit task."""
        return self.task.deployment_key()

    @property
    def executor_kind(self) -> str:
        """The kind of executor that runs this invocation."""
        return self.task.executor_kind

    @property
    def producers(self) -> list[int]:
        """Indices of the invocations whose outputs this one consumes."""
        return sorted(set(self.deps.values()))

    def resolve_input(self, outputs: Sequence[Any]) -> BaseModel:
        """The input with every placeholder replaced by the real value from `outputs`."""
        if not self.deps:
            return self.input
        return type(self.input).model_validate(fill_placeholders(self.input, outputs))


@dataclass(slots=True, eq=False)
class TaskGraph:
    """The unit-task invocations recorded for one request (nodes) and their data dependencies (edges)."""

    root: str
    nodes: list[Invocation] = field(default_factory=list)
    choices: list[int] = field(default_factory=list)

    @property
    def edges(self) -> list[Edge]:
        """Every data dependency, in invocation order."""
        return [Edge(src, node.index, data) for node in self.nodes for data, src in node.deps.items()]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Invocation]:
        return iter(self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible description of the graph (inputs included, tasks by type and config)."""
        return {
            "version": GRAPH_FORMAT_VERSION,
            "root": self.root,
            "nodes": [
                {
                    "index": node.index,
                    "task": {
                        "type": _qualified_name(type(node.task)),
                        "key": node.task_key,
                        "config": node.task.model_dump(mode="json"),
                    },
                    "executor_kind": node.executor_kind,
                    "input_type": _qualified_name(type(node.input)),
                    "input": _encode(node.input),
                }
                for node in self.nodes
            ],
            "edges": [{"src": e.src, "dst": e.dst, "data": e.data} for e in self.edges],
            "choices": list(self.choices),
        }

    def to_json(self, indent: int | None = None) -> str:
        """The graph as a JSON document."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> TaskGraph:
        """Rebuild a graph from `to_dict` output; the task and input classes must be importable."""
        if doc.get("version") != GRAPH_FORMAT_VERSION:
            raise TaskError(f"unsupported task graph format version {doc.get('version')!r}")
        graph = cls(root=doc["root"], choices=list(doc.get("choices", [])))
        deps: dict[int, dict[str, int]] = {}
        for edge in doc.get("edges", []):
            deps.setdefault(edge["dst"], {})[edge["data"]] = edge["src"]
        token = accepting_placeholders.set(True)
        try:
            for spec in doc["nodes"]:
                task_cls = _import(spec["task"]["type"])
                task = task_cls.model_validate(spec["task"]["config"])
                if task.deployment_key() != spec["task"]["key"]:
                    raise TaskError(
                        f"node {spec['index']}: task {spec['task']['type']} rebuilt from its config has key "
                        f"{task.deployment_key()}, the graph says {spec['task']['key']}: the class has changed"
                    )
                input_model = _import(spec["input_type"]).model_validate(_decode(spec["input"]))
                graph.nodes.append(Invocation(spec["index"], task, input_model, deps.get(spec["index"], {})))
        finally:
            accepting_placeholders.reset(token)
        return graph

    @classmethod
    def from_json(cls, text: str) -> TaskGraph:
        """Rebuild a graph from `to_json` output."""
        return cls.from_dict(json.loads(text))


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(path: str) -> Any:
    module_name, _, qualname = path.partition(":")
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def fill_placeholders(obj: Any, outputs: Sequence[Any]) -> Any:
    """`obj` with placeholders replaced by real values from `outputs` (indexed by producer).

    Models become dicts, for the caller to validate into their type.
    """
    if isinstance(obj, DataHandle):
        return output_value(outputs, obj.id) if obj.is_placeholder else obj
    if isinstance(obj, Stream):
        return output_value(outputs, obj.id) if obj.is_placeholder else obj
    if isinstance(obj, BaseModel):
        return {name: fill_placeholders(value, outputs) for name, value in obj.__dict__.items()}
    if isinstance(obj, (list, tuple)):
        return [fill_placeholders(item, outputs) for item in obj]
    if isinstance(obj, dict):
        return {key: fill_placeholders(value, outputs) for key, value in obj.items()}
    return obj


def _encode(obj: Any) -> Any:
    if isinstance(obj, DataHandle):
        return {"$data": obj.id} if obj.is_placeholder else _encode(obj.value)
    if isinstance(obj, Stream):
        if not obj.is_placeholder:
            raise TaskError(f"a live stream ({obj.id}) cannot be written to JSON")
        return {"$stream": obj.id}
    if isinstance(obj, BaseModel):
        return {name: _encode(value) for name, value in obj.__dict__.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(item) for item in obj]
    if isinstance(obj, dict):
        return {str(key): _encode(value) for key, value in obj.items()}
    if isinstance(obj, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    return to_jsonable_python(obj)


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1:
            ((key, value),) = obj.items()
            if key == "$data":
                return DataHandle(value)
            if key == "$stream":
                return Stream(value, placeholder=True)
            if key == "$bytes":
                return base64.b64decode(value)
        return {key: _decode(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_decode(item) for item in obj]
    return obj
