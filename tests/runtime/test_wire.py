"""The replicas' socket transport (runtime/wire.py), without Ray: a server in this process or in a
child process that the test kills."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import subprocess
import sys
import threading

import pytest

from prismserve.errors import ReplicaGone
from prismserve.runtime.wire import ReplicaAddress, WireServer, connection, disconnect
from prismserve.task import InvalidInputError


class Target:
    """Stands for a replica: the methods a wire server exposes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def slow(self, value: int, delay: float) -> int:
        self.calls.append("slow")
        await asyncio.sleep(delay)
        return value

    def add(self, a: int, b: int) -> int:
        self.calls.append("add")
        return a + b

    async def reject(self) -> None:
        raise InvalidInputError("the image is not an image")

    def payload(self, size: int) -> bytes:
        return bytes(range(251)) * (size // 251) + bytes(range(size % 251))

    def echo(self, value: object) -> object:
        return value

    async def unpicklable(self) -> None:
        error = RuntimeError("holds a lock")
        error.lock = threading.Lock()  # type: ignore[attr-defined]
        raise error


METHODS = frozenset({"slow", "add", "reject", "unpicklable", "payload", "echo"})


async def _served(target: Target) -> tuple[WireServer, ReplicaAddress]:
    server = WireServer(target, METHODS)
    return server, await server.start("actor-1", "", "127.0.0.1")


def test_requests_share_one_connection_and_each_gets_its_own_result():
    async def scenario():
        target = Target()
        server, address = await _served(target)
        client = connection(address)
        assert connection(address) is client  # one connection per replica and loop
        slow, fast, added = (
            client.request("slow", 1, 0.05),
            client.request("slow", 2, 0.0),
            client.request("add", 3, 4),
        )
        order = []
        for done in asyncio.as_completed([slow, fast, added]):
            order.append(await done)
        server.close()
        disconnect(address)
        return order

    order = asyncio.run(scenario())
    assert sorted(order) == [1, 2, 7] and order[-1] == 1  # answered as they finish, not as sent


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_frames_of_any_size_interleave_on_one_connection(tcp):
    """Payloads larger than the read buffer (a reader on another node) come whole, their bytes as
    sent, between small requests and arguments of every size on the same connection."""
    sizes = [0, 1, 9, (256 << 10) - 9, 256 << 10, (256 << 10) + 1, 5 << 20]

    async def scenario():
        server, address = await _served(Target())
        if tcp:
            address = dataclasses.replace(address, unix=None)
        client = connection(address)
        calls = []
        for size in sizes:
            calls += [client.request("payload", size), client.request("add", size, 1)]
            calls.append(client.request("echo", b"x" * size))  # a large argument frame
        results = await asyncio.gather(*calls)
        disconnect(address)
        server.close()
        return results

    results = asyncio.run(scenario())
    for i, size in enumerate(sizes):
        payload, added, echoed = results[3 * i : 3 * i + 3]
        assert bytes(payload) == Target().payload(size) and added == size + 1
        assert bytes(echoed) == b"x" * size


def test_errors_travel_to_the_caller_as_they_were_raised():
    async def scenario():
        server, address = await _served(Target())
        client = connection(address)
        with pytest.raises(InvalidInputError, match="not an image"):
            await client.request("reject")
        with pytest.raises(RuntimeError, match="RuntimeError: holds a lock"):  # cannot be pickled: its text
            await client.request("unpicklable")
        with pytest.raises(ValueError, match="no method 'stop'"):
            await client.request("stop")
        assert await client.request("add", 1, 1) == 2  # the connection still serves
        server.close()
        disconnect(address)

    asyncio.run(scenario())


def test_a_caller_without_the_token_is_refused_before_anything_runs():
    async def scenario():
        target = Target()
        server, address = await _served(target)
        forged = dataclasses.replace(address, token=b"0" * 16)
        with pytest.raises(ReplicaGone):
            await connection(forged).request("add", 1, 2)
        server.close()
        return target.calls

    assert asyncio.run(scenario()) == []


def test_stopping_a_replica_fails_the_calls_open_on_it():
    async def scenario():
        server, address = await _served(Target())
        pending = connection(address).request("slow", 1, 30)
        await asyncio.sleep(0.05)
        disconnect(address)  # what WirePool.stop does first
        with pytest.raises(ReplicaGone, match="actor-1"):
            await pending
        server.close()

    asyncio.run(scenario())


_CHILD = """
import asyncio, pickle, sys
from prismserve.runtime.wire import WireServer

class Sleeper:
    async def slow(self, value, delay):
        await asyncio.sleep(delay)
        return value

async def main():
    server = WireServer(Sleeper(), frozenset({"slow"}))
    address = await server.start("child", "", "127.0.0.1")
    sys.stdout.write(pickle.dumps(address).hex() + "\\n")
    sys.stdout.flush()
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_replica_process_that_dies_fails_its_open_calls_with_its_name(transport):
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE)
    try:
        address: ReplicaAddress = pickle.loads(bytes.fromhex(child.stdout.readline().decode()))
        if transport == "tcp":  # as a caller on another node reaches it
            address = dataclasses.replace(address, unix=None)

        async def scenario():
            client = connection(address)
            assert await client.request("slow", 5, 0) == 5
            pending = client.request("slow", 6, 30)
            await asyncio.sleep(0.05)
            child.kill()
            with pytest.raises(ReplicaGone, match="child"):
                await asyncio.wait_for(pending, 10)
            with pytest.raises(ReplicaGone):  # and so do later ones, at once
                await asyncio.wait_for(connection(address).request("slow", 7, 0), 10)

        asyncio.run(scenario())
    finally:
        child.kill()
        child.wait()
