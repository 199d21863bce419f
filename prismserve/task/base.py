"""Tasks: a model's computation as plain Python (000 §5.1, 002 §2.2).

A `UnitTask` is one model component (encoder, LLM, generator) and the unit of deployment. A
composite task is any `Task` whose `invoke` calls other tasks, with arbitrary branches and loops.
`await task(input)` records the unit-task calls into a `TaskGraph`, has a dispatcher execute it,
then replays `invoke` with the real outputs (000 §5.2).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
import random
import typing
from collections.abc import Iterator
from typing import Any, ClassVar, Generic, TypeVar, final

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticSerializationError, to_jsonable_python

from prismserve.task.data import PLAIN_TYPES, DataHandle, Stream, accepting_placeholders
from prismserve.task.descriptor import ExecutorRef, ExecutorSettings
from prismserve.task.dispatch import current_dispatcher
from prismserve.task.errors import TaskDefinitionError, TaskUsageError
from prismserve.task.graph import TaskGraph, data_id
from prismserve.task.session import Session, current_session

InT = TypeVar("InT")
OutT = TypeVar("OutT")


def _holds_placeholder(obj: Any) -> bool:
    cls = type(obj)
    if cls in PLAIN_TYPES:
        return False
    if isinstance(obj, (DataHandle, Stream)):
        return obj.is_placeholder
    if cls is dict or isinstance(obj, dict):
        values: Any = obj.values()
    elif cls is list or cls is tuple or isinstance(obj, (list, tuple)):
        values = obj
    elif hasattr(obj, "__pydantic_fields__"):  # a model; faster than isinstance(obj, BaseModel)
        values = obj.__dict__.values()
    else:
        return False
    for value in values:  # noqa: SIM110 - a loop: any() over a generator is slower on the record path
        if type(value) not in PLAIN_TYPES and _holds_placeholder(value):
            return True
    return False


class TaskData(BaseModel):
    """Base of task inputs and outputs.

    While recording, fields may hold placeholders of any declared type: a model built from
    placeholders skips validation then, and is validated for real when the dispatcher fills it.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    # (name, default, default_factory) of each optional field, for building without validation.
    _optional_fields: ClassVar[tuple[tuple[str, Any, Any], ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._optional_fields = tuple(
            (name, info.default, info.default_factory)
            for name, info in cls.__pydantic_fields__.items()
            if not info.is_required()
        )

    def __init__(self, /, **data: Any) -> None:
        if accepting_placeholders.get() and _holds_placeholder(data):
            self._set_unvalidated(data)
        else:
            super().__init__(**data)

    @model_validator(mode="wrap")
    @classmethod
    def _accept_placeholders(cls, data: Any, handler: Any) -> Any:
        if accepting_placeholders.get() and isinstance(data, dict) and _holds_placeholder(data):
            return cls.construct_unvalidated(data)
        return handler(data)

    @classmethod
    def construct_unvalidated(cls, data: dict[str, Any]) -> Any:
        """An instance holding `data` as given (placeholders included), defaults filled in."""
        obj = cls.__new__(cls)
        obj._set_unvalidated(data)
        return obj

    def _set_unvalidated(self, data: dict[str, Any]) -> None:
        # pydantic's model_construct inspects default factories on every call; this is its fast subset.
        values = dict(data)
        for name, default, factory in self._optional_fields:
            if name not in values:
                values[name] = factory() if factory is not None else copy.copy(default)
        object.__setattr__(self, "__dict__", values)
        object.__setattr__(self, "__pydantic_fields_set__", set(data))
        object.__setattr__(self, "__pydantic_extra__", None)
        object.__setattr__(self, "__pydantic_private__", None)


class TaskInput(TaskData):
    """Input of a task."""

    def pending_tokens(self) -> int:
        """The work this input adds to a replica's queue, in tokens (an LLM's prompt, an encoder's
        media tokens): what token-aware routing balances. 1 unless the input type knows better."""
        return 1


class TaskOutput(TaskData):
    """Output of a task. During record, each field of a unit task's output is a placeholder."""


def _is_stream_type(annotation: Any) -> bool:
    return annotation is Stream or typing.get_origin(annotation) is Stream


def _generic_args(cls: type) -> tuple[Any, ...]:
    for klass in cls.__mro__:
        meta = getattr(klass, "__pydantic_generic_metadata__", None)
        if meta and meta["origin"] is not None and not meta["parameters"]:
            return meta["args"]
    return ()


class Task(BaseModel, Generic[InT, OutT]):
    """A piece of a model's computation. Fields are its configuration.

    Subclasses build subtasks in `post_init` (plain attribute assignment) and implement
    `invoke(input) -> output` as synchronous Python; `await task(input)` runs it.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    input_type: ClassVar[type[Any] | None] = None
    output_type: ClassVar[Any] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.__pydantic_generic_metadata__["origin"] is not None:
            return  # a parametrised alias such as Task[A, B], not a user class
        if inspect.iscoroutinefunction(cls.invoke) or inspect.isasyncgenfunction(cls.invoke):
            raise TaskDefinitionError(
                f"{cls.__qualname__}.invoke must be a plain `def`: it runs twice (record, replay) and "
                "never awaits; put async logic in the app's serve()"
            )
        args = _generic_args(cls)
        if args:
            cls.input_type, cls.output_type = args

    def model_post_init(self, context: Any, /) -> None:
        self.post_init()

    def post_init(self) -> None:
        """Build subtasks here (`self.encoder = EncoderTask(...)`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).__pydantic_fields__ or name.startswith("_"):
            super().__setattr__(name, value)
        else:
            # Subtasks and other state derived from the fields, set in post_init.
            object.__setattr__(self, name, value)

    def invoke(self, task_input: InT) -> OutT:
        """The computation, in plain synchronous Python calling subtasks' invoke()."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement invoke()")

    def subtasks(self) -> list[Task[Any, Any]]:
        """The tasks this task holds directly (in fields or attributes)."""
        return [task for _, task in _named_tasks(self.__dict__)]

    def named_unit_tasks(self, prefix: str = "") -> dict[str, UnitTask[Any, Any]]:
        """Every reachable unit task by attribute path (`thinker.encoders.image`); equivalent ones once."""
        found: dict[str, UnitTask[Any, Any]] = {}
        seen: set[str] = set()
        stack: list[tuple[str, Task[Any, Any]]] = [(prefix, self)]
        while stack:
            path, task = stack.pop(0)
            if isinstance(task, UnitTask):
                if task.deployment_key() not in seen:
                    seen.add(task.deployment_key())
                    found[path] = task
            else:
                stack.extend(
                    (f"{path}.{name}" if path else name, sub) for name, sub in _named_tasks(task.__dict__)
                )
        return found

    def path_to(self, task: Task[Any, Any]) -> str | None:
        """The attribute path of `task` (that very object) inside this task, as named_unit_tasks names it."""
        stack: list[tuple[str, Task[Any, Any]]] = [("", self)]
        while stack:
            path, current = stack.pop(0)
            if current is task:
                return path
            stack.extend(
                (f"{path}.{name}" if path else name, sub) for name, sub in _named_tasks(current.__dict__)
            )
        return None

    def unit_tasks(self) -> dict[str, UnitTask[Any, Any]]:
        """Every unit task reachable from this task, one per deployment key."""
        return {task.deployment_key(): task for task in self.named_unit_tasks().values()}

    def coerce_input(self, task_input: Any) -> Any:
        """The input as the declared input type (a dict is validated into it)."""
        input_type = type(self).input_type
        if not (isinstance(input_type, type) and issubclass(input_type, BaseModel)):
            return task_input  # untyped (Any, a TypeVar): taken as given
        if isinstance(task_input, input_type):
            return task_input
        return input_type.model_validate(task_input)

    def record(self, task_input: InT, *, rng: random.Random | None = None) -> TaskGraph:
        """Run invoke with placeholder outputs and return the graph of unit-task calls."""
        session = Session(TaskGraph(type(self).__qualname__), rng=rng, root=self)
        token = current_session.set(session)
        lenient = accepting_placeholders.set(True)
        try:
            self.invoke(task_input)
        except ValidationError as exc:
            exc.add_note(
                f"while recording {type(self).__qualname__}: unit-task outputs are placeholders during "
                "record; models that carry them must derive from TaskInput or TaskOutput"
            )
            raise
        finally:
            accepting_placeholders.reset(lenient)
            current_session.reset(token)
        return session.graph

    def replay(self, task_input: InT, graph: TaskGraph, outputs: list[Any]) -> OutT:
        """Run invoke again, each unit task returning its real output from `outputs`."""
        session = Session(graph, outputs=outputs, root=self)
        token = current_session.set(session)
        try:
            result = self.invoke(task_input)
        finally:
            current_session.reset(token)
        session.finish_replay()
        return result

    async def __call__(self, task_input: InT, *, rng: random.Random | None = None) -> OutT:
        """Record, dispatch on the current dispatcher, replay; returns invoke's real result."""
        dispatcher = current_dispatcher.get()
        if dispatcher is None:
            raise TaskUsageError(
                f"no dispatcher to run {type(self).__qualname__} on: serve the app with prismserve, or wrap "
                "the call in `with use_dispatcher(LocalDispatcher({...})):` (prismserve.runtime.local)"
            )
        task_input = self.coerce_input(task_input)
        graph = self.record(task_input, rng=rng)
        outputs = await dispatcher.execute(graph)
        return self.replay(task_input, graph, outputs)


def _named_tasks(values: dict[Any, Any]) -> Iterator[tuple[str, Task[Any, Any]]]:
    for name, value in values.items():
        if isinstance(value, Task):
            yield str(name), value
        elif isinstance(value, (list, tuple)):
            yield from ((f"{name}.{n}", t) for n, t in _named_tasks(dict(enumerate(value))))
        elif isinstance(value, dict):
            yield from ((f"{name}.{n}", t) for n, t in _named_tasks(value))


class UnitTask(Task[InT, OutT], ExecutorSettings):
    """An atomic model component, deployed as its own executor replicas.

    Subclasses declare `executor_kind` (which executor backend runs it), optionally `executor_ref`
    (the real engine's Executor and its Python environment, `ExecutorRef`), `default_gpus` and
    `max_gpus` (GPUs per replica when a deployment does not set `gpus`, and the most it may set),
    and their types as `UnitTask[SomeInput, SomeOutput]` (output: a TaskOutput or a `Stream[...]`);
    a unit task is the settings its executor reads (`ExecutorSettings`, `task.components`). Unit
    tasks with the same class and field values are equivalent and share one deployment; `gpus` is
    one of those values, so a deployment's GPU shape is part of its identity.
    """

    model_config = ConfigDict(frozen=True)

    executor_kind: ClassVar[str]
    # The Executor that runs this task for real; None: only `sim` executors and LocalDispatcher
    # callables run it.
    executor_ref: ClassVar[ExecutorRef | None] = None
    # What named the executor before `executor_ref`: declared only to refuse them with a message.
    executor_class: ClassVar[object] = None
    executor_env: ClassVar[object] = None
    # GPUs per replica when a deployment does not say (`gpus`), and the most a deployment may ask
    # for (None: no limit; engines that run on one device set 1).
    default_gpus: ClassVar[float] = 1
    max_gpus: ClassVar[float | None] = None
    # Fields of the output type, with whether each is a stream; None when the output is a Stream.
    _output_fields: ClassVar[tuple[tuple[str, bool], ...] | None] = None

    _key: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _default_gpus(cls, data: Any) -> Any:
        # The class's default, written in before validation, so that the configuration (and the
        # deployment key) is the same whether a deployment sets the default or leaves it out.
        if isinstance(data, dict) and data.get("gpus") is None:
            return {**data, "gpus": cls.default_gpus}
        return data

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        if cls.__pydantic_generic_metadata__["origin"] is None and "invoke" in cls.__dict__:
            raise TaskDefinitionError(
                f"{cls.__qualname__} overrides invoke(), which is final for unit tasks: record & replay "
                "intercept it. The computation belongs in the executor registered for its executor_kind"
            )
        _refuse_retired_names(cls)
        super().__pydantic_init_subclass__(**kwargs)
        if cls.__pydantic_generic_metadata__["origin"] is not None or cls.output_type is None:
            return
        out, inp = cls.output_type, cls.input_type
        if not (isinstance(inp, type) and issubclass(inp, TaskInput)):
            raise TaskDefinitionError(
                f"{cls.__qualname__}: the input type must be a TaskInput subclass, got {inp!r}"
            )
        if _is_stream_type(out):
            cls._output_fields = None
        elif isinstance(out, type) and issubclass(out, TaskOutput):
            cls._output_fields = tuple(
                (name, _is_stream_type(info.annotation)) for name, info in out.model_fields.items()
            )
        else:
            raise TaskDefinitionError(
                f"{cls.__qualname__}: the output type must be a TaskOutput subclass or Stream[...], got {out!r}"
            )

    def model_post_init(self, context: Any, /) -> None:
        cls = type(self)
        if not isinstance(getattr(cls, "executor_kind", None), str) or cls.output_type is None:
            raise TaskDefinitionError(
                f"{cls.__qualname__} cannot be deployed: a unit task class needs `executor_kind = '...'` and "
                "its types, as in `class MyTask(UnitTask[MyInput, MyOutput])`"
            )
        _check_gpus(cls, self.gpus)
        self._key = _deployment_key(self)  # refuses configuration that cannot be serialised, now
        super().model_post_init(context)

    @final
    def invoke(self, task_input: InT) -> OutT:
        """Record (placeholder output) or replay (real output) this call; no computation happens here."""
        session = current_session.get()
        if session is None:
            raise TaskUsageError(
                f"{type(self).__qualname__}.invoke() runs only inside record & replay: call it from a "
                "composite task's invoke(), or run it with `await task(input)`"
            )
        return session.invoke(self, task_input)

    def pending_tokens(self, task_input: InT) -> int:
        """The tokens an invocation with `task_input` adds to its replica's queue (the input's own
        count unless the task knows better: an encoder from its model's processor rules)."""
        return task_input.pending_tokens()  # type: ignore[attr-defined]

    def deployment_key(self) -> str:
        """Stable id of this unit task's deployment: class and field values; equal for equivalent tasks."""
        if self._key is None:  # built without model_post_init (model_construct)
            self._key = _deployment_key(self)
        return self._key

    @classmethod
    def placeholder_output(cls, index: int) -> Any:
        """The stand-in output of invocation `index` during record."""
        if cls._output_fields is None:
            return Stream(data_id(index), placeholder=True)
        values: dict[str, Any] = {
            name: Stream(data_id(index, name), placeholder=True)
            if is_stream
            else DataHandle(data_id(index, name))
            for name, is_stream in cls._output_fields
        }
        return cls.output_type.construct_unvalidated(values)


def _refuse_retired_names(cls: type[UnitTask[Any, Any]]) -> None:
    """Refuse `executor_class` / `executor_env`, which `executor_ref` replaced, saying how to write it."""
    retired = [name for name in ("executor_class", "executor_env") if name in cls.__dict__]
    if retired:
        raise TaskDefinitionError(
            f"{cls.__qualname__} sets {' and '.join(retired)}, which `executor_ref` replaced: write "
            "`executor_ref = ExecutorRef('package.module:ExecutorClass', env=None)` (prismserve.task), "
            "or `executor_ref = None` for a task only `sim` executors and LocalDispatcher functions run"
        )


def _check_gpus(cls: type[UnitTask[Any, Any]], gpus: float) -> None:
    """Refuse a GPU shape no cell can hold: negative, a whole number plus a share (1.5), or more
    than the task's engine runs on."""
    name = cls.__qualname__
    if not (math.isfinite(gpus) and gpus >= 0 and (gpus < 1 or gpus == int(gpus))):
        raise TaskDefinitionError(
            f"{name}: gpus={gpus:g} is not a GPU shape: give 0, a share of one GPU below 1 (0.3), "
            "or a whole number of GPUs (1, 2, 4)"
        )
    if cls.max_gpus is not None and gpus > cls.max_gpus:
        raise TaskDefinitionError(
            f"{name}: gpus={gpus:g}, but its engine runs a replica on at most {cls.max_gpus:g} GPU; "
            'tensor parallelism over several GPUs is for vLLM stages (engine="vllm"): give '
            f"gpus <= {cls.max_gpus:g}, or run more replicas"
        )


def _deployment_key(task: UnitTask[Any, Any]) -> str:
    """`module.Class:digest` of the canonical configuration; raises TaskDefinitionError naming the
    field whose value cannot be serialised (the key, graphs and replicas all need it as JSON)."""
    cls = type(task)
    config = {}
    for name in cls.__pydantic_fields__:
        try:
            config[name] = _canonical(getattr(task, name))
        except (PydanticSerializationError, UnicodeDecodeError, TypeError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TaskDefinitionError(
                f"{cls.__qualname__}.{name} cannot be serialised ({reason}): unit-task configuration must "
                "be plain data (str, UTF-8 bytes, numbers, lists, dicts, sets, pydantic models); build "
                "locks, callables and other live objects in the executor instead"
            ) from None
    digest = hashlib.sha256(_dumps(config).encode()).hexdigest()[:16]
    return f"{cls.__module__}.{cls.__qualname__}:{digest}"


def _dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _canonical(value: Any) -> Any:
    """`value` as JSON data equal in every process for equal values: sets sorted (their iteration
    order follows PYTHONHASHSEED), -0.0 as 0.0, models as their dumped fields, dict keys as strings."""
    if value is None or isinstance(value, (str, int)):  # bool is an int
        return value
    if isinstance(value, float):
        return 0.0 if value == 0 else value
    if isinstance(value, BaseModel):
        return _canonical(value.model_dump(mode="python"))
    if isinstance(value, dict):
        return {k if isinstance(k, str) else _dumps(_canonical(k)): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=_dumps)
    if isinstance(value, (bytes, bytearray)):
        return value.decode()  # pydantic writes bytes to JSON as UTF-8 text
    return _canonical(to_jsonable_python(value))  # enums, paths, dates; raises for live objects
