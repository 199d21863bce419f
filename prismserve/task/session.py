"""Record & replay of one task invocation: the per-request state behind every unit-task call."""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import BaseModel

from prismserve.task.context import current_request
from prismserve.task.data import PLAIN_TYPES, DataHandle, Stream
from prismserve.task.errors import RecordError, ReplayDivergenceError, TaskUsageError
from prismserve.task.graph import Invocation, TaskGraph, output_value, producer_of

if TYPE_CHECKING:
    from prismserve.task.base import Task, UnitTask

# Stateless (draws from the OS), so sharing it is not shared mutable state.
_DEFAULT_RNG = random.SystemRandom()


class Session:
    """Record or replay of one top-level task call; lives in `current_session` while invoke runs."""

    __slots__ = ("recording", "graph", "outputs", "cursor", "choice_cursor", "rng", "root")

    def __init__(
        self,
        graph: TaskGraph,
        *,
        outputs: Sequence[Any] | None = None,
        rng: random.Random | None = None,
        root: Task[Any, Any] | None = None,
    ) -> None:
        self.root = root  # the task recorded or replayed: divergence errors name unit tasks by path in it
        self.recording = outputs is None
        self.graph = graph
        self.outputs = outputs
        self.cursor = 0
        self.choice_cursor = 0
        self.rng = rng or _DEFAULT_RNG

    def invoke(self, task: UnitTask[Any, Any], task_input: Any) -> Any:
        """What a unit task's invoke returns: a placeholder (record) or the real output (replay)."""
        if self.recording:
            return self._record(task, task_input)
        return self._replay(task, task_input)

    def _record(self, task: UnitTask[Any, Any], task_input: Any) -> Any:
        nodes = self.graph.nodes
        index = len(nodes)
        input_type: Any = type(task).input_type  # set on every deployable class
        if not isinstance(task_input, input_type):
            task_input = input_type.model_validate(task_input)
        deps: dict[str, int] = {}
        _collect_placeholders(task_input, deps, index, task)
        nodes.append(Invocation(index, task, task_input, deps))
        return type(task).placeholder_output(index)

    def _replay(self, task: UnitTask[Any, Any], task_input: Any) -> Any:
        index = self.cursor
        nodes = self.graph.nodes
        if index >= len(nodes):
            self._diverged(index, f"it invoked {self._name(task)}, but record made only {len(nodes)} calls")
        node = nodes[index]
        if node.task is not task and node.task_key != task.deployment_key():
            self._diverged(
                index, f"record invoked {self._name(node.task)}, replay invoked {self._name(task)}"
            )
        input_type: Any = type(task).input_type  # set on every deployable class
        if not isinstance(task_input, input_type):
            task_input = input_type.model_validate(task_input)
        difference = _difference(node.input, task_input, self.outputs, "input")
        if difference is not None:
            self._diverged(index, f"{self._name(task)} got {difference}")
        self.cursor = index + 1
        return self.outputs[index]  # type: ignore[index]

    def _name(self, task: UnitTask[Any, Any]) -> str:
        """`path.in.root (Class)`, the root named as the app being served names it (`omni.encoders.image`):
        equivalent unit tasks share a class, so the path tells them apart."""
        if self.root is None:
            return type(task).__name__
        path = self.root.path_to(task)
        names = current_request().task_names
        prefix = names.get(id(self.root)) if names is not None else None
        if prefix is not None:
            path = f"{prefix}.{path}" if path else prefix
        return f"{path} ({type(task).__name__})" if path else type(task).__name__

    def _diverged(self, index: int, what: str) -> NoReturn:
        raise ReplayDivergenceError(
            f"replay of {self.graph.root} diverged at unit-task call #{index}: {what}. invoke() must take the "
            "same path with the same inputs on replay: no side effects, no randomness except replayable_choice()"
        )

    def choose(self, n: int, p: Sequence[float] | None) -> int:
        """The record-time sample of `replayable_choice`, repeated on replay."""
        if self.recording:
            choice = _sample(self.rng, n, p)
            self.graph.choices.append(choice)
            return choice
        k = self.choice_cursor
        if k >= len(self.graph.choices):
            raise ReplayDivergenceError(
                f"replay of {self.graph.root} called replayable_choice() #{k}, but record called it only "
                f"{len(self.graph.choices)} times"
            )
        self.choice_cursor = k + 1
        choice = self.graph.choices[k]
        if not 0 <= choice < n:
            raise ReplayDivergenceError(
                f"replay of {self.graph.root}: replayable_choice() #{k} recorded {choice}, out of range for n={n}"
            )
        return choice

    def finish_replay(self) -> None:
        """Check that replay made every call record made."""
        if self.cursor != len(self.graph.nodes):
            missing = self.graph.nodes[self.cursor]
            self._diverged(
                self.cursor,
                f"record invoked {self._name(missing.task)} there, replay made only {self.cursor} calls",
            )
        if self.choice_cursor != len(self.graph.choices):
            raise ReplayDivergenceError(
                f"replay of {self.graph.root} called replayable_choice() {self.choice_cursor} times, "
                f"record {len(self.graph.choices)} times"
            )


current_session: ContextVar[Session | None] = ContextVar("current_session", default=None)


def replayable_choice(n: int, p: Sequence[float] | None = None) -> int:
    """Sample an index in [0, n) with probabilities `p` once per request; replay returns the same index.

    Call it inside a task's invoke(), for example to pick a planned path (000 Listing 2).
    """
    session = current_session.get()
    if session is None:
        raise TaskUsageError("replayable_choice() must be called inside a task's invoke()")
    return session.choose(n, p)


def _sample(rng: random.Random, n: int, p: Sequence[float] | None) -> int:
    if n < 1:
        raise ValueError(f"replayable_choice needs n >= 1, got {n}")
    if p is None:
        return int(rng.random() * n)
    if len(p) != n:
        raise ValueError(f"replayable_choice got {len(p)} probabilities for n={n}")
    total = 0.0
    for prob in p:
        if not prob >= 0:
            raise ValueError(f"replayable_choice probabilities must be >= 0, got {list(p)}")
        total += prob
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"replayable_choice probabilities must sum to 1, got {total}")
    x = rng.random() * total
    last = 0
    for i, prob in enumerate(p):
        if prob > 0:
            last = i
            if x < prob:
                return i
            x -= prob
    return last  # rounding left x just above the last bucket


def _collect_placeholders(obj: Any, deps: dict[str, int], consumer: int, task: Any) -> None:
    """Find every placeholder inside a unit-task input (nested models, lists, dicts)."""
    if isinstance(obj, (DataHandle, Stream)):
        if obj.is_placeholder:
            producer = producer_of(obj.id) if obj.id[:1].isdigit() else -1
            if not 0 <= producer < consumer:
                raise RecordError(
                    f"{type(task).__name__} got placeholder {obj.id!r} that no earlier call of this request "
                    "produced (was it kept from another request?)"
                )
            deps[obj.id] = producer
        return
    if hasattr(obj, "__pydantic_fields__"):
        children: Any = obj.__dict__.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = obj
    elif isinstance(obj, dict):
        children = obj.values()
    else:
        return
    for child in children:
        if type(child) not in PLAIN_TYPES:  # most fields are plain: skip them without a call
            _collect_placeholders(child, deps, consumer, task)


class _Differs(Exception):
    """Replay's input differs from record's (control flow that never leaves this module); `path`,
    innermost first, is filled in while unwinding."""

    def __init__(self, why: str) -> None:
        self.why = why  # with `{where}` for the field's path
        self.path: list[str] = []


def _difference(recorded: Any, replayed: Any, outputs: Any, where: str) -> str | None:
    """How replay's input differs from record's (`where` names the top), or None."""
    try:
        _compare(recorded, replayed, outputs)
    except _Differs as differs:
        return differs.why.format(where=where + "".join(reversed(differs.path)))
    return None


def _compare(recorded: Any, replayed: Any, outputs: Any) -> None:
    """Raise _Differs where replay's value differs from record's. Cheap: identical objects (the
    request's own fields, handles passed on) end the walk; plain values compare by value."""
    if recorded is replayed:
        return
    cls = type(recorded)
    if cls in PLAIN_TYPES:
        if cls is type(replayed) and recorded != replayed == replayed:  # noqa: PLR0124 - NaN is no difference
            raise _Differs("a different {where} than record did")
    elif cls is DataHandle or cls is Stream:
        _compare_data(recorded, replayed, outputs)
    elif hasattr(recorded, "__pydantic_fields__") or cls is dict:  # faster than isinstance(BaseModel)
        _compare_fields(recorded, replayed, outputs)
    elif cls is list or cls is tuple:
        if not isinstance(replayed, (list, tuple)) or len(replayed) != len(recorded):
            raise _Differs(f"a different {{where}} than record did ({len(recorded)} items at record)")
        for i, rec in enumerate(recorded):
            try:
                if rec is not replayed[i]:
                    _compare(rec, replayed[i], outputs)
            except _Differs as differs:
                differs.path.append(f"[{i}]")
                raise


def _compare_fields(recorded: Any, replayed: Any, outputs: Any) -> None:
    rec = recorded if type(recorded) is dict else recorded.__dict__
    rep = replayed if type(replayed) is dict else getattr(replayed, "__dict__", None)
    if type(rep) is not dict or (type(recorded) is dict is type(replayed) and rec.keys() != rep.keys()):
        raise _Differs("a different {where} than record did")
    for key, value in rec.items():
        if key in rep and value is not rep[key]:
            try:
                _compare(value, rep[key], outputs)
            except _Differs as differs:
                differs.path.append(f".{key}")
                raise


def _compare_data(recorded: Any, replayed: Any, outputs: Any) -> None:
    if recorded.is_placeholder:
        _compare_source(recorded.id, replayed, outputs)
    elif isinstance(recorded, DataHandle) and isinstance(replayed, DataHandle):
        if recorded.is_local and replayed.is_local:  # raw values wrapped afresh on each run
            _compare(recorded.value, replayed.value, outputs)
        elif recorded.id != replayed.id:
            raise _Differs("another handle at {where} than record did")


def _compare_source(data: str, replayed: Any, outputs: Any) -> None:
    """Pass when `replayed` is (or wraps) output `data`, as record's placeholder says it should be."""
    expected = output_value(outputs, data)
    if replayed is expected:
        return
    if isinstance(replayed, DataHandle) and replayed.is_local and replayed.value is expected:
        return
    if isinstance(expected, DataHandle) and expected.is_local and expected.value is replayed:
        return
    recorded = f"output {data!r} of call #{producer_of(data)}"
    if isinstance(replayed, (DataHandle, Stream)) or isinstance(expected, (DataHandle, Stream)):
        raise _Differs(f"{{where}} from {_source_of(replayed, outputs)}, where record had {recorded}")
    if type(replayed) is type(expected) and type(expected) in PLAIN_TYPES and replayed != expected:
        raise _Differs(f"a different {{where}} than {recorded}, which record passed there")
    # A plain container copied by validation: where it came from cannot be told cheaply.


def _source_of(value: Any, outputs: Any) -> str:
    """Which call's output `value` is (only on the error path: scans every output)."""
    for index, output in enumerate(outputs):
        fields = output.__dict__ if isinstance(output, BaseModel) else {}
        if output is value or any(v is value for v in fields.values()):
            return f"call #{index}"
        wrapped = value.value if isinstance(value, DataHandle) and value.is_local else value  # never fetch
        if wrapped is not None and any(v is wrapped for v in fields.values()):
            return f"call #{index}"
    return "no earlier call of this replay"
