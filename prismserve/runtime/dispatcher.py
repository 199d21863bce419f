"""ReplicaDispatcher: sends every invocation of a graph to a replica at once; data flows replica to replica.

One dispatcher for every runtime: the replicas' pool (Ray actors, or in process) carries the calls.
Each consumer's call names its producers' result references, so it starts once its inputs exist and
the (small) outputs move straight between replicas; large payloads stay in the producers'
shared-memory slabs (see dataplane). The caller only receives the outputs replay needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import propagate
from opentelemetry import trace as otel_trace

from prismserve.errors import InputLost, ReplicaDied, UnavailableError
from prismserve.runtime.replica import Call, localize
from prismserve.runtime.stage_stats import StreamWatch
from prismserve.runtime.task_manager import Lease, NoReplicaError, Replica, ReplicaState, TaskManager
from prismserve.task import DispatchError, InvalidInputError, Stream, TaskError, TaskGraph
from prismserve.task.context import current_request
from prismserve.task.graph import Invocation, data_id
from prismserve.task.routing import RoutingPolicy

log = logging.getLogger(__name__)
_tracer = otel_trace.get_tracer("prismserve.dispatcher")


@dataclass(slots=True)
class _Sent:
    """One invocation of an attempt: its tokens, where it went and the reference of its result.

    A consumer whose deployment picks replicas by load (`dynamic`, `tokens`) has no lease until its
    producers' results exist (`_pull`): its replica is chosen then, with the load as it is then
    (ModServe's pull hand-off), and it fetches their payloads from where they were made.
    """

    node: Invocation
    manager: TaskManager
    tokens: int
    lease: Lease | None = None
    ref: Any = None


@dataclass(slots=True)
class _Graph:
    """An executed graph's replicas, whose payloads and streams are released together: when its
    request ends (`scoped`: counted in the replicas' `users` until then), else after a while."""

    request: str
    dispatcher: ReplicaDispatcher
    scoped: bool
    replicas: list[tuple[TaskManager, Replica]] = field(default_factory=list)
    released: bool = False

    def add(self, manager: TaskManager, replica: Replica) -> None:
        """Count a replica the graph ran on (one chosen late is released alone if the graph was)."""
        if self.released:
            loop = asyncio.get_running_loop()
            loop.call_later(
                self.dispatcher.release_after_s, self.dispatcher.release, self.request, [(manager, replica)]
            )
            return
        self.replicas.append((manager, replica))
        if self.scoped:  # a draining replica stays up until the request ends
            replica.users += 1

    def release(self) -> None:
        """Release what the graph left on its replicas (once)."""
        if not self.released:
            self.released = True
            self.dispatcher.release(self.request, self.replicas)
            if self.scoped:
                for _, replica in self.replicas:
                    replica.users -= 1


class ReplicaDispatcher:
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
        self._releases: dict[int, tuple[TaskManager, Replica, list[str]]] = {}
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
        sent = await self._leases(graph)
        context = current_request()
        if context.ledger is not None:  # the request's prompt as its calls count it: its SLO's deadline
            context.ledger.tokens = max([context.ledger.tokens, *(each.tokens for each in sent)])
        deadline = context.first_due()
        try:
            self._submit(request, sent, carrier, deadline)
        except BaseException:
            for each in sent:
                if each.lease is not None:
                    each.lease.release()
            raise
        tracked = self._track(request)
        for each in sent:
            if each.lease is not None:
                tracked.add(each.manager, each.lease.replica)
            else:
                call = Call(request, each.node.index, each.node.input, each.node.producers, carrier, deadline)
                each.ref = asyncio.get_running_loop().create_task(self._pull(each, call, sent, tracked))
        # Outputs that are only streams are handed back at once and fill as the replicas produce;
        # the others (data handles) are awaited: replay needs them to exist.
        outputs: list[Any] = [None] * len(sent)
        awaited, feeds = [], []
        for each in sent:
            if _streams_only(each.node):
                call = Call(request, each.node.index, each.node.input, each.node.producers, carrier, deadline)
                outputs[each.node.index], feed = self._streaming(each, self._sender(call, sent))
                feeds.append(feed)
            else:
                awaited.append(each)
        results = await asyncio.gather(
            *(self._result(each.manager, each.ref, each.lease) for each in awaited), return_exceptions=True
        )
        for each, result in zip(awaited, results, strict=True):
            if isinstance(result, BaseException):
                for feed in feeds:  # the attempt is abandoned: its streams must not resend
                    feed.cancel()
                raise self._failure(each.node.index, each.manager, each.lease, result) from result
            outputs[each.node.index] = localize(result)
        return outputs

    async def _leases(self, graph: TaskGraph) -> list[_Sent]:
        """One lease per invocation, taken in order: each pick sees the request's earlier picks;
        none yet for a consumer whose replica is picked by load (`_pull` takes it later)."""
        sent: list[_Sent] = []
        try:
            for node in graph.nodes:
                manager = await self._manager(node)
                each = _Sent(node, manager, node.task.pending_tokens(node.input))
                if not (node.producers and (manager.policy or self.policy) not in _UPFRONT):
                    each.lease = await self._lease(node.index, manager, each.tokens)
                sent.append(each)
        except BaseException:
            for each in sent:
                if each.lease is not None:
                    each.lease.release()
            raise
        return sent

    async def _pull(self, each: _Sent, call: Call, sent: list[_Sent], tracked: _Graph) -> Any:
        """A consumer's result, its replica picked once its producers' results exist (by the load
        then); it fetches their payloads from where they were made. A producer's failure reaches
        the call through its inputs, and fails it as the producer's. A streaming call keeps its
        lease until its streams end (`_streaming` gives it back)."""
        produced = [sent[p].ref for p in call.producers]
        for ref in produced:
            with contextlib.suppress(Exception):
                await ref
        lease = each.lease = await self._lease(call.index, each.manager, each.tokens)
        tracked.add(each.manager, lease.replica)
        ref = each.manager.pool.submit(lease.replica, [call], call.producers, produced)[0]
        return await self._result(each.manager, ref, lease, hold=_streams_only(each.node))

    def load(self, key: str) -> tuple[int, int]:
        """A deployment's calls in flight (leases held on its running replicas) and running replicas:
        what path-level routing (`path`) weighs a request's paths by; counted locally, nobody is
        asked. `key` is the deployment the app names (mapped by the request's `targets`); unknown: (0, 0)."""
        targets = current_request().targets
        manager = self.managers.get(targets.get(key, key) if targets else key)
        if manager is None:
            return 0, 0
        running = [r for r in manager.replicas if r.state is ReplicaState.RUNNING]
        return sum(r.in_flight for r in running), len(running)

    async def _manager(self, node: Invocation) -> TaskManager:
        """The task manager of an invocation's deployment (for a plan with deployment options: the
        deployment of the option the request's path sends it to)."""
        targets = current_request().targets
        manager = self.managers.get(targets.get(node.task_key, node.task_key) if targets else node.task_key)
        if manager is None:
            raise DispatchError.at(
                node.index, type(node.task).__name__, "has no deployment: register the app that uses it"
            )
        return manager

    async def _lease(self, index: int, manager: TaskManager, tokens: int = 1) -> Lease:
        # The plan gives it none and none is starting (as between a full cluster's old cells removed
        # and its new ones added, when leases wait): not a failure, a 503 that says so.
        if not manager.replicas and not manager.expected:
            kind = current_request().request_type or "this"
            raise UnavailableError(
                f"the deployed plan gives {manager.name} no replica: requests of type {kind!r} were "
                "not in the workload it was planned for; plan with a workload that has them "
                "(--profile-workload) or deploy a plan that gives it replicas"
            )
        try:
            return await manager.lease(self.policy, tokens)
        except NoReplicaError as exc:
            raise DispatchError.at(index, manager.name, f"cannot run: {exc}") from None

    @staticmethod
    def _submit(request: str, sent: list[_Sent], carrier: dict[str, str], deadline: float | None) -> None:
        """Send every invocation that has its lease; those at the same depth on the same replica are
        independent and travel in one call."""
        for group in _groups(
            [each.node for each in sent], [each.lease.replica if each.lease else None for each in sent]
        ):
            producers = sorted({p for i in group for p in sent[i].node.producers})
            calls = [
                Call(request, i, sent[i].node.input, sent[i].node.producers, carrier, deadline) for i in group
            ]
            first = sent[group[0]]
            assert first.lease is not None  # `_groups` leaves out the invocations without one
            refs = first.manager.pool.submit(
                first.lease.replica, calls, producers, [sent[p].ref for p in producers]
            )
            for i, ref in zip(group, refs, strict=True):
                sent[i].ref = ref

    @staticmethod
    def _sender(call: Call, sent: list[_Sent]) -> Callable[[TaskManager, Replica], Any]:
        """Sends `call` again, alone, to another replica (its producers' results are still held)."""
        produced = [sent[p].ref for p in call.producers]
        return lambda manager, replica: manager.pool.submit(replica, [call], call.producers, produced)[0]

    async def _answer(self, sent: _Sent, resend: Callable[[TaskManager, Replica], Any]) -> Any:
        """A streaming invocation's result (its lease held: its streams are still to come); a call
        whose own replica died is sent once more to a healthy one."""
        index, manager = sent.node.index, sent.manager
        try:
            return await self._result(manager, sent.ref, sent.lease, hold=True)
        except BaseException as exc:  # noqa: BLE001 - classified below
            error = self._failure(index, manager, sent.lease, exc)
            if not isinstance(error, ReplicaDied) or isinstance(error, InputLost):
                raise error from exc
            log.warning("resending call #%d after its replica died: %s", index, error)
        lease = sent.lease = await self._lease(index, manager, sent.tokens)
        try:
            return await self._result(manager, resend(manager, lease.replica), lease, hold=True)
        except BaseException as exc:  # noqa: BLE001 - the second failure is final
            raise self._failure(index, manager, lease, exc) from exc

    def _streaming(
        self, sent: _Sent, resend: Callable[[TaskManager, Replica], Any]
    ) -> tuple[Any, asyncio.Task[None]]:
        """Local streams standing for a streaming invocation's output, fed once its replica answers;
        and the task feeding them."""
        node = sent.node
        task_class = type(node.task)
        sent_at = time.perf_counter()
        streams: dict[str | None, Stream[Any]]
        if task_class._output_fields is None:
            streams = {None: Stream(data_id(node.index))}
            output: Any = streams[None]
        else:
            streams = {name: Stream(data_id(node.index, name)) for name, _ in task_class._output_fields}
            output = task_class.output_type.model_validate(streams)

        async def feed() -> None:
            try:
                result = localize(await self._answer(sent, resend))
            except BaseException as exc:  # noqa: BLE001 - the streams' readers get the failure
                for stream in streams.values():
                    stream.fail(exc)
                return
            sources = {None: result} if None in streams else result.__dict__
            stats = sent.manager.stats
            left = len(streams)

            def ended() -> None:  # before the last stream closes: its readers see the replica free
                nonlocal left
                left -= 1
                if not left:
                    _give_back(sent.lease)

            await asyncio.gather(
                *(
                    _fill(stream, sources[name], stats.watch(sent_at), ended)
                    for name, stream in streams.items()
                )
            )

        feeding = asyncio.get_running_loop().create_task(feed())
        self._feeding.add(feeding)  # the loop keeps only weak references to tasks
        feeding.add_done_callback(self._feeding.discard)
        # The replica works until the streams end: its lease (busy time, load) lasts as long (given
        # back as the last one ends; else, failed or cancelled, when the feed is done).
        feeding.add_done_callback(lambda _: _give_back(sent.lease))
        return output, feeding

    @staticmethod
    async def _result(manager: TaskManager, ref: Any, lease: Lease | None, hold: bool = False) -> Any:
        """The call's result; its lease (None: a pulled call, which holds its own) given back, but for
        a streaming call's (`hold`) that answered: its streams are still to come."""
        try:
            result = await manager.pool.result(ref)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        if lease is not None and not hold:
            lease.release()
        return result

    def _failure(
        self, index: int, manager: TaskManager, lease: Lease | None, error: BaseException
    ) -> TaskError:
        """The error a failed call raises; restarts its replica when that replica is the one that died
        (a pulled call that failed before it had one: no replica of its own was involved)."""
        if lease is None:
            cause = manager.pool.cause(error)
            return (
                cause
                if isinstance(cause, TaskError)
                else DispatchError.at(index, manager.name, f"failed: {cause}")
            )
        replica = lease.replica
        death = manager.pool.death(error, replica)
        if death == "replica":
            manager.restart(replica)
            return ReplicaDied.at(index, manager.name, f"failed: its replica {replica.id} died")
        if death == "input":
            return InputLost.at(index, manager.name, "failed: an input's replica died")
        cause = manager.pool.cause(error)
        if isinstance(cause, InvalidInputError):  # the request's fault, not the replica's (its class kept)
            return type(cause)(f"call #{index} ({manager.name}) rejected its input: {cause}")
        if isinstance(cause, DispatchError):  # already names its call (a producer's, or a stream's)
            return cause
        return DispatchError.at(index, manager.name, f"failed: {type(cause).__name__}: {cause}")

    def _track(self, request: str) -> _Graph:
        """The record of a graph's replicas, released when its request ends (else after `release_after_s`)."""
        ledger = current_request().ledger
        tracked = _Graph(request, self, scoped=ledger is not None)
        if ledger is not None:
            ledger.at_end.append(tracked.release)
        else:
            asyncio.get_running_loop().call_later(self.release_after_s, tracked.release)
        return tracked

    def release(self, request: str, replicas: list[tuple[TaskManager, Replica]]) -> None:
        """Queue the release of what a graph left on its replicas; sent in batches, one call per replica."""
        for manager, replica in replicas:
            self._releases.setdefault(id(replica), (manager, replica, []))[2].append(request)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.release_batch_s, self._send_releases)

    def _send_releases(self) -> None:
        self._flush = None
        batches, self._releases = self._releases, {}
        for manager, replica, requests in batches.values():
            manager.pool.release(replica, requests)


# Policies whose replicas are picked when the request's graph is sent (no load read): `path` chose
# the request's whole path at its entry and follows it as `static` does.
_UPFRONT = ("static", "path")


def _give_back(lease: Lease | None) -> None:
    """Release `lease` if there is one (a pulled call may not have taken its own yet)."""
    if lease is not None:
        lease.release()


def _streams_only(node: Invocation) -> bool:
    """Whether an invocation's output is a stream, or a TaskOutput made of streams only."""
    fields = type(node.task)._output_fields
    return fields is None or all(is_stream for _, is_stream in fields)


async def _fill(stream: Stream[Any], source: Any, watch: StreamWatch, ended: Callable[[], None]) -> None:
    """Feed `stream` from a producer's stream (None: the producer has no such stream), each item
    seen by `watch` (the stage's times and token counts); `ended` is called once the source is
    spent, before the stream closes."""
    if source is None:
        ended()
        stream.close()
    else:
        await stream.drain(_watched(source, watch, ended))


async def _watched(
    source: AsyncIterable[Any], watch: StreamWatch, ended: Callable[[], None]
) -> AsyncIterator[Any]:
    async for item in source:
        watch.item(item)
        yield item
    watch.done()
    ended()


def _groups(nodes: list[Invocation], replicas: list[Replica | None]) -> list[list[int]]:
    """Invocation indices grouped by (depth in the graph, replica), in an order that respects
    dependencies; those without a replica yet are left out."""
    depth: list[int] = []
    for node in nodes:
        depth.append(1 + max((depth[p] for p in node.producers), default=-1))
    groups: dict[tuple[int, int], list[int]] = {}
    for index, replica in enumerate(replicas):
        if replica is not None:
            groups.setdefault((depth[index], id(replica)), []).append(index)
    return [groups[key] for key in sorted(groups, key=lambda k: k[0])]
