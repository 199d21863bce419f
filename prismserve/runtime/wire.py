"""The replicas' direct transport: framed pickles over a Unix socket (same node) or TCP.

Ray places, starts, health-checks and stops the replicas; calls, results, stream reads and releases
travel over one connection per (process, replica) instead of Ray actor calls, because a Ray actor
call costs 1.1–1.4 ms on these machines and a Unix-socket round trip 0.07–0.09 ms
(`benchmarks/bench_transports.py`). Every replica serves its methods on a socket (`WireServer`);
callers, the gateway and other replicas reading streams alike, share one `WireClient` per replica
and event loop (`connection`).

A frame is a header (payload length, message id, kind) and a pickle. The first frame a client sends
is the replica's token: the socket accepts pickles, so only holders of the replica's address (which
travels only inside the cluster's own messages) may talk to it. When a connection drops — the
replica's process died — every call waiting on it fails with `ReplicaGone` naming the replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import pickle
import secrets
import struct
import sys
import weakref
from dataclasses import dataclass
from typing import Any

from prismserve.errors import DispatchError, ReplicaGone

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!IIB")  # payload bytes, message id, kind
_AUTH, _REQUEST, _NOTIFY, _OK, _ERROR, _BYTES = range(6)  # _BYTES: a result of bytes, unpickled


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    """Where a replica's socket listens, and the token it expects."""

    actor_id: str
    node_id: str
    unix: str | None  # an abstract Unix socket name (Linux), for callers on the same node
    host: str
    port: int
    token: bytes

    async def read_stream(self, stream_id: str, start: int) -> tuple[list[Any], bool, DispatchError | None]:
        """Items of a stream the replica holds, from `start` on (see `StreamTable.read`)."""
        return await connection(self).request("read_stream", stream_id, start)

    async def read_data(self, data_id: str) -> bytes:
        """The bytes of a payload in the replica's slab (a reader on another node)."""
        return await connection(self).request("read_data", data_id)


def dumps(value: Any) -> bytes:
    """A pickle that carries classes of app files by value (Ray's cloudpickle, as Ray's own calls do)."""
    from ray import cloudpickle

    return cloudpickle.dumps(value, protocol=5)


class _Framed(asyncio.BufferedProtocol):
    """Splits the byte stream into frames and hands each to `frame`.

    Reads land in a scratch buffer that holds many small frames at once. A frame too large for it
    (a payload read from another node) is read straight into a buffer of its own size: its bytes
    are copied once, not gathered read by read. `frame` gets a view that is valid only during the
    call (it unpickles it there).
    """

    SCRATCH_BYTES = 256 * 1024

    def __init__(self) -> None:
        self.transport: Any = None  # an asyncio or uvloop (vLLM's loop) transport
        self._scratch = bytearray(self.SCRATCH_BYTES)
        self._view = memoryview(self._scratch)
        self._held = 0  # bytes at the scratch buffer's start not framed yet
        self._large: memoryview | None = None  # the payload of a large frame being read
        self._large_at = 0
        self._large_head = (0, 0)  # its message id and kind

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return self._large[self._large_at :]
        return self._view[self._held :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._large_at += nbytes
            if self._large_at == len(self._large):
                payload, self._large = self._large, None
                self.frame(*self._large_head, payload)
            return
        self._held += nbytes
        start = 0
        while self._held - start >= _HEADER.size:
            size, message, kind = _HEADER.unpack_from(self._scratch, start)
            end = start + _HEADER.size + size
            if end > self._held:
                if _HEADER.size + size > len(self._scratch):  # read the rest into its own buffer
                    got = self._held - start - _HEADER.size
                    large = memoryview(bytearray(size))
                    large[:got] = self._view[start + _HEADER.size : self._held]
                    self._large, self._large_at, self._large_head = large, got, (message, kind)
                    start = self._held
                break
            self.frame(message, kind, self._view[start + _HEADER.size : end])
            start = end
            if self.transport is None or self.transport.is_closing():
                return
        rest = self._held - start
        if start and rest:
            self._scratch[:rest] = bytes(self._view[start : self._held])
        self._held = rest

    def send(self, message: int, kind: int, payload: bytes) -> None:
        header = _HEADER.pack(len(payload), message, kind)
        if len(payload) < self.SCRATCH_BYTES:
            self.transport.write(header + payload)  # one write: one system call for a small frame
        else:  # not copied into one more buffer first
            self.transport.write(header)
            self.transport.write(payload)

    def frame(self, message: int, kind: int, payload: memoryview) -> None:
        raise NotImplementedError


class _ServerSide(_Framed):
    """One caller's connection to a replica: checks the token, then runs each request."""

    def __init__(self, server: WireServer) -> None:
        super().__init__()
        self._server = server
        self._trusted = False

    def frame(self, message: int, kind: int, payload: memoryview) -> None:
        if not self._trusted:
            if kind != _AUTH or not hmac.compare_digest(payload, self._server.token):
                log.warning("refused a connection without the replica's token")
                self.transport.close()
                return
            self._trusted = True
            return
        try:
            method, args = pickle.loads(payload)
            if method not in self._server.methods:
                raise ValueError(f"no method {method!r} on this replica")
            result = getattr(self._server.target, method)(*args)
        except Exception as exc:  # noqa: BLE001 - the caller gets it (a request it could not read too)
            if kind == _REQUEST:
                self._reply(message, error=exc)
            return
        if asyncio.iscoroutine(result):
            task = asyncio.get_running_loop().create_task(result)
            self._server.running.add(task)
            task.add_done_callback(self._server.running.discard)
            if kind == _REQUEST:
                task.add_done_callback(lambda done: self._finished(message, done))
        elif kind == _REQUEST:
            self._reply(message, result)

    def _finished(self, message: int, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self._reply(message, error=RuntimeError("the replica is stopping"))
        elif task.exception() is not None:
            self._reply(message, error=task.exception())
        else:
            self._reply(message, task.result())

    def _reply(self, message: int, result: Any = None, error: BaseException | None = None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if error is None:
            if isinstance(result, bytes):  # a payload: sent as it is, not pickled and copied again
                self.send(message, _BYTES, result)
            else:
                self.send(message, _OK, dumps(result))
            return
        try:
            payload = dumps(error)
        except Exception:  # noqa: BLE001 - an error that cannot travel goes as its text
            payload = dumps(RuntimeError(f"{type(error).__name__}: {error}"))
        self.send(message, _ERROR, payload)


class WireServer:
    """Serves `methods` of `target` (a replica) on an abstract Unix socket and a TCP port."""

    def __init__(self, target: Any, methods: frozenset[str]) -> None:
        self.target = target
        self.methods = methods
        self.token = secrets.token_bytes(16)
        self.running: set[asyncio.Task[Any]] = set()
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self, actor_id: str, node_id: str, host: str) -> ReplicaAddress:
        """Listen; returns the address callers connect to. `host` is the node's address in the
        cluster (127.0.0.1 for a local one): only callers on other nodes use TCP."""
        loop = asyncio.get_running_loop()
        unix = None
        if sys.platform.startswith("linux"):
            unix = f"\0prismserve-{os.getpid()}-{secrets.token_hex(4)}"
            self._servers.append(await loop.create_unix_server(lambda: _ServerSide(self), unix))
        tcp = await loop.create_server(lambda: _ServerSide(self), host, 0)
        self._servers.append(tcp)
        port = tcp.sockets[0].getsockname()[1]
        return ReplicaAddress(actor_id, node_id, unix, host, port, self.token)

    def close(self) -> None:
        """Stop listening and cancel the requests still running."""
        for server in self._servers:
            server.close()
        for task in list(self.running):
            task.cancel()


class WireClient(_Framed):
    """This process's connection to one replica; requests are multiplexed by message id."""

    def __init__(self, address: ReplicaAddress) -> None:
        super().__init__()
        self.address = address
        self.closed = False
        self._ids = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._queued: list[bytes] = []  # frames sent before the connection was made
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop, address = asyncio.get_running_loop(), self.address
        try:
            if address.unix is not None and address.node_id == _node_id():
                await loop.create_unix_connection(lambda: self, address.unix)
            else:
                await loop.create_connection(lambda: self, address.host, address.port)
        except OSError as exc:
            log.debug("cannot reach replica %s: %s", address.actor_id, exc)  # stopped or restarting
            self.connection_lost(None)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.send(0, _AUTH, self.address.token)
        self.transport.writelines(self._queued)
        self._queued.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._pending:
            log.warning(
                "lost replica %s with %d calls open: %s", self.address.actor_id, len(self._pending), exc
            )
        self.closed = True
        self.transport = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ReplicaGone(self.address.actor_id))

    def request(self, method: str, *args: Any) -> asyncio.Future[Any]:
        """Send a request now; the future is its result (or raises the replica's error)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_exception(ReplicaGone(self.address.actor_id))
            return future
        self._ids += 1
        self._pending[self._ids] = future
        self._write(self._ids, _REQUEST, dumps((method, args)))
        return future

    def notify(self, method: str, *args: Any) -> None:
        """Send a request whose result nobody needs (lost if the replica is gone)."""
        if not self.closed:
            self._write(0, _NOTIFY, dumps((method, args)))

    def _write(self, message: int, kind: int, payload: bytes) -> None:
        if self.transport is None:
            self._queued.append(_HEADER.pack(len(payload), message, kind) + payload)
        else:
            self.send(message, kind, payload)

    def frame(self, message: int, kind: int, payload: memoryview) -> None:
        future = self._pending.pop(message, None)
        if future is None or future.done():
            return
        if kind == _BYTES:  # a large frame's buffer is the caller's; a view into scratch is copied
            future.set_result(bytes(payload) if payload.obj is self._scratch else payload.obj)
            return
        try:
            value = pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - e.g. a class this process cannot import
            future.set_exception(exc)
            return
        if kind == _OK:
            future.set_result(value)
        else:
            future.set_exception(value)

    def close(self) -> None:
        """Drop the connection; open calls fail with ReplicaGone."""
        self._connecting.cancel()
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ReplicaAddress, WireClient]] = (
    weakref.WeakKeyDictionary()
)


def connection(address: ReplicaAddress) -> WireClient:
    """This event loop's connection to the replica at `address` (made on first use)."""
    clients = _clients.setdefault(asyncio.get_running_loop(), {})
    client = clients.get(address)
    if client is None or client.closed:
        client = clients[address] = WireClient(address)
    return client


def disconnect(address: ReplicaAddress) -> None:
    """Close every connection of this process to a replica that is being stopped."""
    for clients in list(_clients.values()):
        client = clients.pop(address, None)
        if client is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing is waiting
                client.close()


def read_once(address: ReplicaAddress, method: str, *args: Any) -> Any:
    """One request from code that has no event loop (a connection of its own, closed after)."""

    async def once() -> Any:
        client = WireClient(address)
        try:
            return await client.request(method, *args)
        finally:
            client.close()

    return asyncio.run(once())


def _node_id() -> str:
    from prismserve.runtime.dataplane import current_node_id

    return current_node_id()
