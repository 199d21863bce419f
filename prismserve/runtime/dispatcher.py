"""RayDispatcher: sends every invocation of a graph to a replica at once; data flows replica to replica.

Each consumer's call names its producers' result objects as arguments, so Ray starts it once its
inputs exist and moves the (small) outputs straight between replicas; large payloads stay in the
producers' shared-memory slabs (see dataplane). The gateway only receives the outputs replay needs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal

from opentelemetry import propagate
from opentelemetry import trace as otel_trace

from prismserve.runtime.replica import Call, localize
from prismserve.runtime.task_manager import Lease, NoReplicaError, Replica, TaskManager
from prismserve.task import DispatchError, InvalidInputError, Stream, TaskError, TaskGraph
from prismserve.task.graph import Invocation, data_id

log = logging.getLogger(__name__)
_tracer = otel_trace.get_tracer("prismserve.dispatcher")

RoutingPolicy = Literal["static", "dynamic"]

# Graphs executed inside a request scope: released together when the scope closes.
_scope: ContextVar[list[tuple[str, list[Replica], RayDispatcher]] | None] = ContextVar(
    "prismserve_request_scope", default=None
)


class ReplicaDied(DispatchError):
    """A replica died while holding an invocation."""


class InputLost(ReplicaDied):
    """An invocation's input was lost with the replica that produced it."""


class RayDispatcher:
    """Executes task graphs on the replicas of the deployments' task managers."""

    def __init__(
        self,
        managers: dict[str, TaskManager],
        policy: RoutingPolicy = "static",
        release_after_s: float = 300.0,
    ) -> None:
        self.managers = managers
        self.policy = policy
        self.release_after_s = release_after_s
        self.release_batch_s = 0.05
        self._releases: dict[int, tuple[Any, list[str]]] = {}
        self._id_prefix = f"{os.getpid():x}{uuid.uuid4().hex[:6]}-"
        self._request_ids = itertools.count()
        self._flush: asyncio.TimerHandle | None = None
        self._feeding: set[asyncio.Task[None]] = set()

    async def execute(self, graph: TaskGraph) -> list[Any]:
        """Run the graph; one that lost a replica before its outputs returned is run once more.

        The retry policy (docs/runtime.md): a graph whose awaited outputs failed because a replica
        died (the invocation's own or a producer's) is abandoned, its streams' feeds cancelled, and
        run once more on healthy replicas; a streaming invocation whose own replica died after the
        graph returned is sent once more, alone (`_answer`). The request's own faults and executor
        errors are never retried.
        """
        with _tracer.start_as_current_span("dispatch", attributes={"prismserve.invocations": len(graph)}):
            try:
                return await self._execute_once(graph)
            except ReplicaDied as exc:
                log.warning("retrying %s after a replica died: %s", graph.root, exc)
                return await self._execute_once(graph)

    async def _execute_once(self, graph: TaskGraph) -> list[Any]:
        request = f"{self._id_prefix}{next(self._request_ids):x}"
        carrier: dict[str, str] = {}
        if otel_trace.get_current_span().is_recording():
            propagate.inject(carrier)
        nodes = graph.nodes
        leases = await self._leases(graph)
        managers = [self.managers[node.task_key] for node in nodes]
        refs: list[Any] = [None] * len(nodes)
        try:
            # Invocations at the same depth on the same replica are independent: one Ray call runs them all.
            for group in _groups(graph, [lease.replica for lease in leases]):
                producers = sorted({p for i in group for p in nodes[i].producers})
                calls = [Call(request, i, nodes[i].input, nodes[i].producers, carrier) for i in group]
                handle = leases[group[0]].replica.handle
                result = handle.invoke.options(num_returns=len(group)).remote(calls, producers, *(refs[p] for p in producers))
                for i, ref in zip(group, [result] if len(group) == 1 else result):
                    refs[i] = ref
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        self._track(request, [lease.replica for lease in leases])
        # Outputs that are only streams are handed back at once and fill as the replicas produce;
        # the others (data handles) are awaited: replay needs them to exist.
        outputs: list[Any] = [None] * len(nodes)
        awaited = []
        feeds = []
        for node, ref, manager, lease in zip(nodes, refs, managers, leases):
            if _streams_only(node):
                call = Call(request, node.index, node.input, node.producers, carrier)
                resend = self._sender(call, [refs[p] for p in node.producers])
                outputs[node.index], feed = self._streaming(node, ref, manager, lease, resend)
                feeds.append(feed)
            else:
                awaited.append(node)
        results = await asyncio.gather(*(self._result(refs[n.index], leases[n.index]) for n in awaited), return_exceptions=True)
        for node, result in zip(awaited, results):
            if isinstance(result, BaseException):
                for feed in feeds:  # the attempt is abandoned: its streams must not resend
                    feed.cancel()
                raise self._failure(node.index, managers[node.index], leases[node.index], result) from result
            outputs[node.index] = localize(result)
        return outputs

    async def _leases(self, graph: TaskGraph) -> list[Lease]:
        """One lease per invocation, taken in order: each pick sees the request's earlier picks."""
        leases: list[Lease] = []
        try:
            for node in graph.nodes:
                manager = self.managers.get(node.task_key)
                if manager is None:
                    raise DispatchError(
                        f"call #{node.index} ({type(node.task).__name__}) has no deployment: register the app that uses it"
                    )
                try:
                    leases.append(await manager.lease(dynamic=self.policy == "dynamic"))
                except NoReplicaError as exc:
                    raise DispatchError(f"call #{node.index} ({manager.name}) cannot run: {exc}") from None
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        return leases

    @staticmethod
    def _sender(call: Call, produced: list[Any]) -> Callable[[Replica], Any]:
        """Sends `call` again, alone, to another replica (its producers' results are still held)."""
        return lambda replica: replica.handle.invoke.remote([call], call.producers, *produced)

    async def _answer(self, node: Invocation, ref: Any, manager: TaskManager, lease: Lease, resend: Callable[[Replica], Any]) -> Any:
        """The invocation's result; a call whose own replica died is sent once more to a healthy one."""
        try:
            return await self._result(ref, lease)
        except BaseException as exc:  # noqa: BLE001 - classified below
            error = self._failure(node.index, manager, lease, exc)
            if not isinstance(error, ReplicaDied) or isinstance(error, InputLost):
                raise error from exc
            log.warning("resending call #%d after its replica died: %s", node.index, error)
        try:
            lease = await manager.lease(dynamic=self.policy == "dynamic")
        except NoReplicaError as exc:
            raise DispatchError(f"call #{node.index} ({manager.name}) cannot run: {exc}") from None
        try:
            return await self._result(resend(lease.replica), lease)
        except BaseException as exc:  # noqa: BLE001 - the second failure is final
            raise self._failure(node.index, manager, lease, exc) from exc

    def _streaming(
        self, node: Invocation, ref: Any, manager: TaskManager, lease: Lease, resend: Callable[[Replica], Any]
    ) -> tuple[Any, asyncio.Task[None]]:
        """Local streams standing for a streaming invocation's output, fed once its replica answers;
        and the task feeding them."""
        task_class = type(node.task)
        if task_class._output_fields is None:
            streams = {None: Stream(data_id(node.index))}
            output: Any = streams[None]
        else:
            streams = {name: Stream(data_id(node.index, name)) for name, _ in task_class._output_fields}
            output = task_class.output_type.model_validate(streams)

        async def feed() -> None:
            try:
                result = localize(await self._answer(node, ref, manager, lease, resend))
            except BaseException as exc:  # noqa: BLE001 - the streams' readers get the failure
                for stream in streams.values():
                    stream.fail(exc)
                return
            sources = {None: result} if None in streams else result.__dict__
            await asyncio.gather(*(_fill(stream, sources[name]) for name, stream in streams.items()))

        feeding = asyncio.get_running_loop().create_task(feed())
        self._feeding.add(feeding)  # the loop keeps only weak references to tasks
        feeding.add_done_callback(self._feeding.discard)
        feeding.add_done_callback(lambda _: lease.release())  # also when cancelled before it ran
        return output, feeding

    @staticmethod
    async def _result(ref: Any, lease: Lease) -> Any:
        try:
            return await ref
        finally:
            lease.release()

    def _failure(self, index: int, manager: TaskManager, lease: Lease, error: BaseException) -> TaskError:
        """The error a failed call raises; restarts its replica when that replica is the one that died.

        Ray reports a call whose input's producer died as a task error that is also an actor error,
        naming the producer's actor: only the replica whose own actor died is restarted.
        """
        from ray.exceptions import RayActorError, RayTaskError

        replica = lease.replica
        cause = error.cause if isinstance(error, RayTaskError) and error.cause is not None else error
        if isinstance(cause, RayActorError):
            dead = cause.actor_id
            if dead == replica.actor_id or (dead is None and not isinstance(error, RayTaskError)):
                manager.restart(replica)
                return ReplicaDied(f"call #{index} ({manager.name}) failed: its replica {replica.id} died")
            return InputLost(f"call #{index} ({manager.name}) failed: an input's replica died")
        if isinstance(cause, InvalidInputError):  # the request's fault, not the replica's
            return InvalidInputError(f"call #{index} ({manager.name}) rejected its input: {cause}")
        return DispatchError(f"call #{index} ({manager.name}) failed: {type(cause).__name__}: {cause}")

    def _track(self, request: str, replicas: list[Replica]) -> None:
        scope = _scope.get()
        if scope is not None:
            scope.append((request, replicas, self))
        else:
            asyncio.get_running_loop().call_later(self.release_after_s, self.release, request, replicas)

    def release(self, request: str, replicas: list[Replica]) -> None:
        """Queue the release of what a graph left on its replicas; sent in batches, one call per replica."""
        for replica in replicas:
            self._releases.setdefault(id(replica.handle), (replica.handle, []))[1].append(request)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.release_batch_s, self._send_releases)

    def _send_releases(self) -> None:
        self._flush = None
        batches, self._releases = self._releases, {}
        for handle, requests in batches.values():
            try:
                handle.release.remote(requests)
            except Exception:  # noqa: BLE001 - a dead replica has nothing left to release
                pass


def _streams_only(node: Invocation) -> bool:
    """Whether an invocation's output is a stream, or a TaskOutput made of streams only."""
    fields = type(node.task)._output_fields
    return fields is None or all(is_stream for _, is_stream in fields)


async def _fill(stream: Stream[Any], source: Any) -> None:
    """Feed `stream` from a producer's stream (None: the producer has no such stream)."""
    if source is None:
        stream.close()
    else:
        await stream.drain(source)


def _groups(graph: TaskGraph, replicas: list[Replica]) -> list[list[int]]:
    """Invocation indices grouped by (depth in the graph, replica), in an order that respects dependencies."""
    depth: list[int] = []
    for node in graph.nodes:
        depth.append(1 + max((depth[p] for p in node.producers), default=-1))
    groups: dict[tuple[int, int], list[int]] = {}
    for index, replica in enumerate(replicas):
        groups.setdefault((depth[index], id(replica)), []).append(index)
    return [groups[key] for key in sorted(groups, key=lambda k: k[0])]


@contextmanager
def request_scope() -> Iterator[None]:
    """Release the payloads and streams of every graph executed inside when the block ends."""
    graphs: list[tuple[str, list[Replica], RayDispatcher]] = []
    token = _scope.set(graphs)
    try:
        yield
    finally:
        _scope.reset(token)
        for request, replicas, dispatcher in graphs:
            dispatcher.release(request, replicas)
