"""What a replica leaves on its host when it dies uncleanly, recorded at start and removed at stop.

A replica's executor may start processes of its own (vLLM's engine core and its worker), and those
create shared-memory segments (vLLM's message queue: 160 MB under /dev/shm). An engine shut down
cleanly takes them with it; a replica killed (`ray.kill`, a Ray that went down first because Ctrl-C
or SIGTERM reached its whole process group) leaves them: orphaned engines holding their memory (on a
GPU, the GPU's), segments that stay until a reboot. So a replica records its process tree and the
segments its children map once its executor has loaded (`record`), and whoever stops it removes
what is still there (`remove`). Processes are known by pid and start time, so a pid reused since
is never touched; segments by the exact path the engine mapped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

SHM = "/dev/shm/"
GRACE_S = 5.0  # how long killed processes get to be gone before their segments are unlinked


def record(own: Iterable[str] = ()) -> dict[str, Any]:
    """This process, its descendants, the shared-memory segments they map and this process's `own`
    segments (JSON-able)."""
    import psutil

    me = psutil.Process()
    tree = [me, *me.children(recursive=True)]
    segments = {m.path for p in tree[1:] for m in _maps(p) if m.path.startswith(SHM)}
    return {
        "host": socket.gethostname(),
        "processes": [[p.pid, p.create_time()] for p in tree],
        "shm": sorted(segments | set(own)),
    }


def remove(recorded: dict[str, Any] | None, *, root: bool = False) -> list[str]:
    """Kill what is left of the `recorded` processes and unlink the recorded segments once they are
    gone; returns what was removed. The recording process itself (the replica) only with `root`:
    its own stopper (Ray) ends it otherwise, and reports a worker killed under it as a crash. A
    record of another host is left to that host (nothing is removed)."""
    import psutil

    if not recorded or recorded.get("host") != socket.gethostname():
        return []
    killed = []
    for i, (pid, created) in enumerate(recorded["processes"]):
        if pid == os.getpid() or (i == 0 and not root):
            continue
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if abs(process.create_time() - created) < 0.01:  # the same process, not a reused pid
                process.kill()
                killed.append(process)
    alive = _outliving(killed, GRACE_S)
    removed = [f"process {p.pid}" for p in killed if p not in alive]
    if alive:  # still mapped: unlinking would not free the memory, and the kill is what failed
        log.warning("processes %s outlived SIGKILL; their shared memory is left", [p.pid for p in alive])
        return removed
    for path in recorded["shm"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


def _outliving(processes: list[Any], timeout_s: float) -> list[Any]:
    """Those of the killed `processes` still running after `timeout_s`. A zombie counts as gone:
    its memory is freed, and its parent (a replica Ray is still ending) may never reap it."""
    import psutil

    def running(process: Any) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if running(p)]
    return alive


def _maps(process: Any) -> list[Any]:
    """The memory maps of `process`; none if it has gone or is not ours to read."""
    import psutil

    try:
        return process.memory_maps()
    except psutil.Error:
        return []
