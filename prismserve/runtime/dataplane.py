"""The data plane: payloads go from producer to consumer through shared memory, never the gateway.

Each producing replica owns a pre-faulted shared-memory slab (`/dev/shm`) and writes large payloads
into it; a `ShmRef` (path, offset, size, type) travels with the unit-task output instead. A consumer
on the same node maps the slab and reads the payload without copying; one on another node asks the
owning replica for its bytes over the replica's own socket (runtime/wire.py, TCP between nodes), not
through Ray's object store. Small payloads travel inline.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

INLINE_BYTES = 64 * 1024
SHM_DIR = "/dev/shm"
SLAB_PREFIX = "prismserve-"

# Open mappings of other replicas' slabs, by path: a process-wide cache of OS mappings, like an
# open-file cache. Mappings are never closed while the process lives: views handed out point into them.
_MAPPINGS: dict[str, mmap.mmap] = {}


def payload_size(value: Any) -> int:
    """Bytes a payload occupies, or -1 when it must be pickled to be measured."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return -1


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a payload sits in a replica's slab, and how to rebuild it."""

    data_id: str
    node_id: str
    path: str
    offset: int
    nbytes: int
    kind: str  # "ndarray", "bytes" or "pickle"
    dtype: str = ""
    shape: tuple[int, ...] = ()
    owner: Any = None  # the owning replica's address (`ReplicaAddress`), for readers on other nodes

    def fetch(self) -> Any:
        """The payload, as a read-only view for arrays (zero-copy on the same node). Blocks: from a
        coroutine, use `fetch_async`."""
        if self.node_id == current_node_id():
            return self._read_local()
        from prismserve.runtime.wire import read_once

        return decode_payload(memoryview(read_once(self.owner, "read_data", self.data_id)), self)

    async def fetch_async(self) -> Any:
        """The payload, without blocking the event loop on a remote read."""
        if self.node_id == current_node_id():
            return self._read_local()
        return decode_payload(memoryview(await self.owner.read_data(self.data_id)), self)

    def _read_local(self) -> Any:
        mapping = _MAPPINGS.get(self.path)
        if mapping is None:
            with open(self.path, "rb") as f:
                mapping = _MAPPINGS[self.path] = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        return decode_payload(memoryview(mapping)[self.offset : self.offset + self.nbytes], self)


def decode_payload(buffer: memoryview, ref: ShmRef) -> Any:
    """The payload stored in `buffer` as described by `ref`."""
    if ref.kind == "ndarray":
        return np.frombuffer(buffer, dtype=np.dtype(ref.dtype)).reshape(ref.shape)
    if ref.kind == "bytes":
        return bytes(buffer)
    return pickle.loads(buffer)


def current_node_id() -> str:
    """The Ray node this process runs on ('' outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - no Ray context in this process
        return ""


def reclaim_dead_slabs(directory: str = SHM_DIR) -> list[str]:
    """Remove the slabs of processes that are gone: a killed replica cannot remove its own, and
    64 MiB would stay in /dev/shm for good. Called by every new slab on its node; returns the paths."""
    removed = []
    for name in os.listdir(directory):
        pid = name[len(SLAB_PREFIX) :].split("-", 1)[0]
        if not name.startswith(SLAB_PREFIX) or not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class ShmSlab:
    """A pre-faulted shared-memory region with a first-fit allocator; owned by one replica.

    Payloads are freed explicitly (`free`) when their request ends, or once older than `ttl_s`
    when space runs out.
    """

    def __init__(self, size: int, node_id: str, owner: Any = None, ttl_s: float = 300.0) -> None:
        self.size = size
        self.node_id = node_id
        self.owner = owner
        self.ttl_s = ttl_s
        reclaim_dead_slabs()
        self.path = os.path.join(SHM_DIR, f"{SLAB_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self._bytes[:] = 0  # touch every page now, so that writes later run at memcpy speed
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, length), sorted by offset
        self._used: dict[str, tuple[int, int, float]] = {}  # data id -> (offset, length, created)
        self._refs: dict[str, ShmRef] = {}

    @property
    def used_bytes(self) -> int:
        """Bytes held by live payloads."""
        return sum(length for _, length, _ in self._used.values())

    def write(self, data_id: str, value: Any, pickled: bytes | None = None) -> ShmRef | None:
        """Store `value` (`pickled`: its pickle, when the caller has it); None when it does not fit
        even after evicting expired payloads."""
        kind, dtype, shape = "pickle", "", ()
        if pickled is not None:
            raw = np.frombuffer(pickled, dtype=np.uint8)
        elif isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)
            kind, dtype, shape, raw = (
                "ndarray",
                value.dtype.str,
                value.shape,
                value.reshape(-1).view(np.uint8),
            )
        elif isinstance(value, (bytes, bytearray, memoryview)):
            kind, raw = "bytes", np.frombuffer(value, dtype=np.uint8)
        else:
            raw = np.frombuffer(pickle.dumps(value, protocol=5), dtype=np.uint8)
        offset = self._allocate(raw.nbytes) if raw.nbytes else 0
        if offset is None:
            return None
        self._bytes[offset : offset + raw.nbytes] = raw
        self._used[data_id] = (offset, raw.nbytes, time.monotonic())
        ref = ShmRef(
            data_id, self.node_id, self.path, offset, raw.nbytes, kind, dtype, tuple(shape), self.owner
        )
        self._refs[data_id] = ref
        return ref

    def stored(self, data_id: str) -> bytes:
        """A copy of a stored payload's bytes (for readers on other nodes; `ShmRef` decodes them)."""
        if data_id not in self._used:
            raise KeyError(f"payload {data_id} was released or never stored")
        offset, length, _ = self._used[data_id]
        return bytes(memoryview(self._map)[offset : offset + length])

    def free_prefix(self, prefix: str) -> None:
        """Release every payload whose id starts with `prefix`."""
        self.free([data_id for data_id in self._used if data_id.startswith(prefix)])

    def free(self, data_ids: list[str]) -> None:
        """Release payloads; unknown ids are ignored."""
        for data_id in data_ids:
            entry = self._used.pop(data_id, None)
            self._refs.pop(data_id, None)
            if entry is not None and entry[1]:
                self._release(entry[0], entry[1])

    def close(self) -> None:
        """Remove the slab from /dev/shm (existing readers keep their mappings)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _allocate(self, length: int) -> int | None:
        offset = self._first_fit(length)
        if offset is None:
            now = time.monotonic()
            self.free([i for i, (_, _, created) in self._used.items() if now - created > self.ttl_s])
            offset = self._first_fit(length)
        return offset

    def _first_fit(self, length: int) -> int | None:
        for i, (offset, size) in enumerate(self._free):
            if size >= length:
                if size == length:
                    del self._free[i]
                else:
                    self._free[i] = (offset + length, size - length)
                return offset
        return None

    def _release(self, offset: int, length: int) -> None:
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < offset:
            i += 1
        free.insert(i, (offset, length))
        # Coalesce with the neighbours so that large payloads find room again.
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
            free[i] = (free[i][0], free[i][1] + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]
