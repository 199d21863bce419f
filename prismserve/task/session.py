"""Record & replay of one task invocation: the per-request state behind every unit-task call."""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from prismserve.task.data import DataHandle, Stream
from prismserve.task.errors import RecordError, ReplayDivergenceError, TaskUsageError
from prismserve.task.graph import Invocation, TaskGraph, producer_of

if TYPE_CHECKING:
    from prismserve.task.base import UnitTask

# Stateless (draws from the OS), so sharing it is not shared mutable state.
_DEFAULT_RNG = random.SystemRandom()


class Session:
    """Record or replay of one top-level task call; lives in `current_session` while invoke runs."""

    __slots__ = ("recording", "graph", "outputs", "cursor", "choice_cursor", "rng")

    def __init__(
        self,
        graph: TaskGraph,
        *,
        outputs: Sequence[Any] | None = None,
        rng: random.Random | None = None,
    ) -> None:
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
        return self._replay(task)

    def _record(self, task: UnitTask[Any, Any], task_input: Any) -> Any:
        nodes = self.graph.nodes
        index = len(nodes)
        input_type = type(task).input_type
        if not isinstance(task_input, input_type):
            task_input = input_type.model_validate(task_input)
        deps: dict[str, int] = {}
        _collect_placeholders(task_input, deps, index, task)
        nodes.append(Invocation(index, task, task_input, deps))
        return type(task).placeholder_output(index)

    def _replay(self, task: UnitTask[Any, Any]) -> Any:
        index = self.cursor
        nodes = self.graph.nodes
        if index >= len(nodes):
            raise ReplayDivergenceError(
                f"replay of {self.graph.root} diverged at unit-task call #{index}: it invoked "
                f"{type(task).__name__}, but record made only {len(nodes)} calls. invoke() must take the "
                "same path on replay: no side effects, no randomness except replayable_choice()"
            )
        node = nodes[index]
        if node.task is not task and node.task_key != task.deployment_key():
            raise ReplayDivergenceError(
                f"replay of {self.graph.root} diverged at unit-task call #{index}: record invoked "
                f"{type(node.task).__name__}, replay invoked {type(task).__name__}. invoke() must take the "
                "same path on replay: no side effects, no randomness except replayable_choice()"
            )
        self.cursor = index + 1
        return self.outputs[index]  # type: ignore[index]

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
            raise ReplayDivergenceError(
                f"replay of {self.graph.root} diverged at unit-task call #{self.cursor}: record invoked "
                f"{type(missing.task).__name__} there, replay made only {self.cursor} calls"
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
    elif isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
        return
    elif hasattr(obj, "__pydantic_fields__"):
        for value in obj.__dict__.values():
            _collect_placeholders(value, deps, consumer, task)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for item in obj:
            _collect_placeholders(item, deps, consumer, task)
    elif isinstance(obj, dict):
        for value in obj.values():
            _collect_placeholders(value, deps, consumer, task)

