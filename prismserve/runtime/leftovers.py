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


def remove(recorded: dict[str, Any] | None) -> list[str]:
    """Kill what is left of the `recorded` processes (this one spared) and unlink the recorded
    segments once they are gone; returns what was removed. A record of another host is left to
    that host (nothing is removed)."""
    import psutil

    if not recorded or recorded.get("host") != socket.gethostname():
        return []
    killed = []
    for pid, created in recorded["processes"]:
        if pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if abs(process.create_time() - created) < 0.01:  # the same process, not a reused pid
                process.kill()
                killed.append(process)
    _, alive = psutil.wait_procs(killed, timeout=GRACE_S)
    removed = [f"process {p.pid}" for p in killed if p not in alive]
    if alive:  # still mapped: unlinking would not free the memory, and the kill is what failed
        log.warning("processes %s outlived SIGKILL; their shared memory is left", [p.pid for p in alive])
        return removed
    for path in recorded["shm"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


def _maps(process: Any) -> list[Any]:
    """The memory maps of `process`; none if it has gone or is not ours to read."""
    import psutil

    try:
        return process.memory_maps()
    except psutil.Error:
        return []
