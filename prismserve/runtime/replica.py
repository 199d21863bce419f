"""ExecutorReplica: the Ray actor that runs one replica of a unit-task deployment."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import sys
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import propagate
from opentelemetry import trace as otel_trace
from pydantic import BaseModel

from prismserve.executors.spec import ExecutorSpec
from prismserve.runtime import leftovers
from prismserve.runtime.dataplane import INLINE_BYTES, ShmSlab, payload_size
from prismserve.runtime.streams import RemoteStream, RemoteStreamRef, StreamTable
from prismserve.runtime.wire import ReplicaAddress, WireServer
from prismserve.task import DataHandle, DispatchError, InvalidInputError, Stream, UnitTask
from prismserve.task.context import RequestContext, use_request
from prismserve.task.graph import fill_placeholders

_tracer = otel_trace.get_tracer("prismserve.executor")

# What callers may ask a replica over its socket (runtime/wire.py).
WIRE_METHODS = frozenset({"invoke", "read_stream", "read_data", "release", "queue_depth", "metrics"})


@dataclass(slots=True)
class Call:
    """One invocation sent to a replica."""

    request: str  # unique per executed graph; prefixes every data and stream id of the graph
    index: int
    input: BaseModel  # the recorded input, placeholders where producers' outputs go
    producers: list[int]  # invocation indices of the outputs passed alongside
    trace: dict[str, str] = field(default_factory=dict)
    deadline: float | None = None  # Unix time its request's first output is due by (its SLO)


@dataclass(frozen=True, slots=True)
class ObjectStoreRef:
    """A payload kept in Ray's object store (when a slab is full or absent)."""

    ref: Any

    def fetch(self) -> Any:
        import ray

        return ray.get(self.ref)

    async def fetch_async(self) -> Any:
        return await self.ref


def pickle_calls(calls: list[Call]) -> bytes:
    """Calls as one pickle. Ray's own serialisation of the pydantic inputs cost about 0.25 ms a call
    each way here (a call with a `list[Call]` argument: 1.85 ms, the same calls as bytes: 1.22 ms,
    an empty call: 1.31 ms); bytes cross as they are. Ray's cloudpickle, so that classes of app
    files travel by value as with Ray's own pickling."""
    from ray import cloudpickle

    return cloudpickle.dumps(calls)


def localize(output: Any) -> Any:
    """A producer's output as a consumer uses it: remote streams become local Stream views."""
    if isinstance(output, RemoteStreamRef):
        return RemoteStream(output)
    if isinstance(output, BaseModel):
        remote = {k: RemoteStream(v) for k, v in output.__dict__.items() if isinstance(v, RemoteStreamRef)}
        if remote:
            return output.model_copy(update=remote)
    return output


async def naming_errors(source: AsyncIterator[Any], index: int, task_name: str) -> AsyncIterator[Any]:
    """`source`'s items; an error it raises becomes a DispatchError naming the call and its task
    (an InvalidInputError stays one: the request's fault)."""
    try:
        async for item in source:
            yield item
    except (DispatchError, InvalidInputError):
        raise
    except Exception as exc:  # noqa: BLE001 - every consumer of the stream gets the named error
        raise DispatchError.at(index, task_name, f"failed: {type(exc).__name__}: {exc}") from exc


def freeze_heap() -> None:
    """Put every object alive now out of the garbage collector's sight, as vLLM's server does once
    it has started (`vllm.utils.gc_utils.freeze_gc_heap`). torch, transformers, vLLM and a loaded
    model leave 450,000-730,000 objects that live as long as the process; a full collection walked
    them all, 300-490 ms in a loaded LLM replica on this machine, and every stream the replica
    served stood still meanwhile. Frozen, a full collection walks only what serving allocated."""
    gc.collect()
    gc.freeze()


class ExecutorReplica:
    """Runs invocations of one unit task with its executor; holds the streams and payloads it produced.

    Ray runs it as an actor (outputs exported: streams held here for remote readers, large payloads
    in a shared-memory slab); `in_process` runs it in the caller's process, outputs kept as they are.
    """

    def __init__(
        self,
        key: str,
        task: UnitTask[Any, Any],
        spec: ExecutorSpec,
        slab_bytes: int,
        *,
        in_process: bool = False,
    ) -> None:
        self.key = key
        self.task = task
        self.spec = spec
        self.slab_bytes = slab_bytes
        self.in_process = in_process
        self.streaming = type(task)._output_fields is None
        self._active = 0
        self._streams = StreamTable()
        self._slab: ShmSlab | None = None
        self._pumps: set[asyncio.Task[Any]] = set()
        self._wire: WireServer | None = None
        self.address: ReplicaAddress | None = None

    async def start(self) -> dict[str, Any]:
        """Build and load the executor; returns where the replica runs."""
        if self.in_process:
            self.executor = self.spec.build(self.task)
            await self.executor.load()
            return {"pid": os.getpid(), "python": sys.executable}
        import ray

        from prismserve.observability import setup_tracing

        setup_tracing("prismserve-executor")  # exports only when OTEL_EXPORTER_OTLP_ENDPOINT is set
        context = ray.get_runtime_context()
        self._node = context.get_node_id()
        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        if self.spec.backend == "model":  # sim replicas never need a device (nor torch)
            from prismserve.executors.loading import check_device

            check_device(f"{type(self.task).__name__} ({self.key})", gpu_ids)
        self.executor = self.spec.build(self.task)
        await self.executor.load()
        output_type = type(self.task).output_type
        actor_id = context.get_actor_id() or ""
        self._wire = WireServer(self, WIRE_METHODS)
        host = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == self._node)
        self.address = await self._wire.start(actor_id, self._node, host)
        if self.slab_bytes and not self.streaming and _has_handle_fields(output_type):
            self._slab = ShmSlab(self.slab_bytes, self._node, owner=self.address)
        # The engine's processes and segments, and the slab, to remove at stop whatever happens.
        self._leftovers = leftovers.record([self._slab.path] if self._slab is not None else [])
        freeze_heap()  # loaded: what is alive now lives as long as the replica
        return {
            "leftovers": self._leftovers,
            "wire": self.address,
            "actor_id": actor_id,
            "node_id": self._node,
            "pid": os.getpid(),
            "python": sys.executable,
            "gpu_ids": gpu_ids,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "gc_frozen": gc.get_freeze_count(),
        }

    async def health(self) -> None:
        """Raise if the executor cannot serve."""
        await self.executor.health()

    def queue_depth(self) -> int:
        """Invocations running or waiting here (streams until they end)."""
        return self._active

    async def invoke(self, calls: list[Call] | bytes, producers: list[int], *produced: Any) -> Any:
        """Run invocations (independent of each other) of one graph; producers' outputs follow.

        `calls` may come pickled (`pickle_calls`). Returns the output of the single call, or a list
        of outputs in call order.
        """
        if isinstance(calls, bytes):
            from ray import cloudpickle

            batch: list[Call] = cloudpickle.loads(calls)
        else:
            batch = calls
        outputs: dict[int, Any] = dict(zip(producers, produced, strict=True))
        if len(batch) == 1:
            return await self._invoke(batch[0], outputs)
        return list(await asyncio.gather(*(self._invoke(call, outputs) for call in batch)))

    async def _invoke(self, call: Call, produced: dict[int, Any]) -> Any:
        context = propagate.extract(call.trace) if call.trace else None
        with (
            _tracer.start_as_current_span(
                f"execute {type(self.task).__name__}",
                context=context,
                attributes={"prismserve.call": call.index},
            ),
            use_request(
                RequestContext(id=call.request, deadline=call.deadline)
            ),  # the executor's queue reads it
        ):
            self._active += 1
            try:
                task_input = await self._input(call, produced)
                if self.streaming:
                    return await self._start_stream(call, task_input)
                output = await self.executor.run(task_input)
            except BaseException:
                self._active -= 1
                raise
            self._active -= 1
            return self._export(call, output)

    async def _input(self, call: Call, produced: dict[int, Any]) -> Any:
        if not call.producers:
            task_input = call.input
        else:
            outputs: list[Any] = [None] * (max(call.producers) + 1)
            for index in call.producers:
                outputs[index] = localize(produced[index])
            task_input = type(call.input).model_validate(fill_placeholders(call.input, outputs))
        remote = _remote_handles(task_input)
        if remote:
            await asyncio.gather(*(handle.fetch() for handle in remote))
        return task_input

    async def _start_stream(self, call: Call, task_input: Any) -> RemoteStreamRef | Stream[Any]:
        stream: Stream[Any] = Stream(f"{call.request}/{call.index}")
        if not self.in_process:
            self._streams.add(stream)
        self._keep_pumping(stream, self._pump(stream, call, task_input))
        ref: RemoteStreamRef | Stream[Any]
        if self.in_process:
            await stream.wait_beyond(0)
            ref = stream
        else:
            assert self.address is not None  # started as an actor
            ref = await self._streams.first_batch(stream, self.address)
        items, _, error = stream.snapshot(0)
        if isinstance(error, InvalidInputError) and not items:
            raise error  # rejected before any output: the call fails as the request's fault (a 4xx)
        return ref

    async def _pump(self, stream: Stream[Any], call: Call, task_input: Any) -> None:
        try:
            source = naming_errors(self.executor.stream(task_input), call.index, type(self.task).__name__)
            await stream.drain(source)
        finally:
            self._active -= 1

    def _keep_pumping(self, stream: Stream[Any], pump: Coroutine[Any, Any, None]) -> None:
        """Run `pump`, which fills `stream`, until it ends or the stream's request is released."""
        task = asyncio.get_running_loop().create_task(pump, name=stream.id)
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    def _export(self, call: Call, output: Any) -> Any:
        output_type = type(self.task).output_type
        if not isinstance(output, output_type):
            output = output_type.model_validate(output)
        if self.in_process:
            return output
        update: dict[str, Any] = {}
        for name, value in output.__dict__.items():
            data_id = f"{call.request}/{call.index}.{name}"
            if isinstance(value, DataHandle) and value.is_local:
                # A value measured only by pickling it (a list, a dict) is pickled once: small ones
                # travel inline, like small arrays, instead of through the slab and a reference.
                size = payload_size(value.value)
                pickled = pickle.dumps(value.value, protocol=5) if size < 0 else None
                if (len(pickled) if pickled is not None else size) > INLINE_BYTES:
                    update[name] = DataHandle(data_id, ref=self._store(data_id, value.value, pickled))
            elif isinstance(value, Stream) and not value.is_placeholder:
                # Held under the call's id, so that the request's release frees it.
                renamed: Stream[Any] = Stream(data_id)
                self._streams.add(renamed)
                assert self.address is not None  # exported only by an actor
                self._keep_pumping(renamed, renamed.drain(value))
                update[name] = RemoteStreamRef(self.address, renamed.id)
        return output.model_copy(update=update) if update else output

    def _store(self, data_id: str, value: Any, pickled: bytes | None) -> Any:
        ref = self._slab.write(data_id, value, pickled) if self._slab is not None else None
        if ref is None:
            import ray

            return ObjectStoreRef(ray.put(value))
        return ref

    async def read_stream(self, stream_id: str, start: int) -> tuple[list[Any], bool, DispatchError | None]:
        """Items of a stream from `start` on (waits for one unless the stream ended)."""
        return await self._streams.read(stream_id, start)

    def metrics(self) -> str:
        """This process's Prometheus metrics in the text format: a vLLM engine's own (`vllm:…`)."""
        from prometheus_client import REGISTRY, generate_latest

        return generate_latest(REGISTRY).decode()

    def read_data(self, data_id: str) -> bytes:
        """A payload's bytes, for a reader on another node."""
        if self._slab is None:
            raise KeyError(f"replica of {self.key} holds no payload {data_id}")
        return self._slab.stored(data_id)

    def release(self, requests: list[str]) -> None:
        """Free the payloads and streams of executed graphs, and stop the work still filling their
        streams: nobody can read them any more (a request cancelled mid-stream: a talker stops
        talking at its next step instead of speaking to its last code)."""
        for request in requests:
            prefix = f"{request}/"
            if self._slab is not None:
                self._slab.free_prefix(prefix)
            self._streams.release_prefix(prefix)
            for pump in [p for p in self._pumps if p.get_name().startswith(prefix)]:
                pump.cancel()
            executor = getattr(self, "executor", None)  # None: released before it loaded
            if executor is not None:
                executor.cancel(request)  # what fills the streams those pumps read

    async def stop(self) -> None:
        """Close the executor (an engine's processes, a model's memory), the socket and the slab."""
        if self._wire is not None:
            self._wire.close()
        if self._slab is not None:
            self._slab.close()
        executor = getattr(self, "executor", None)
        if executor is not None:
            await executor.close()
        await asyncio.to_thread(leftovers.remove, getattr(self, "_leftovers", None))  # what close left


def _has_handle_fields(output_type: Any) -> bool:
    import typing

    return any(
        info.annotation is DataHandle or typing.get_origin(info.annotation) is DataHandle
        for info in output_type.model_fields.values()
    )


def _remote_handles(obj: Any) -> list[DataHandle[Any]]:
    found: list[DataHandle[Any]] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, DataHandle):
            if not item.is_local and item.ref is not None:
                found.append(item)
        elif isinstance(item, BaseModel):
            stack.extend(item.__dict__.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found
