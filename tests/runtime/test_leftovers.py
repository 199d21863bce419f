"""What a replica leaves when it dies uncleanly (an engine's processes, their shared memory) is
recorded at start and removed at stop; a pid reused since, or another host's record, is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

from prismserve.runtime import leftovers

# An engine stand-in: creates a shared-memory segment as vLLM's message queue does, maps it, waits.
ENGINE = """
import sys, time
from multiprocessing import shared_memory
segment = shared_memory.SharedMemory(create=True, size=1 << 20)
print(segment.name, flush=True)
time.sleep(600)
"""


def test_an_engine_left_running_is_killed_and_its_shared_memory_unlinked(tmp_path):
    own = tmp_path / "slab"
    own.write_bytes(b"x")
    with replica_running(own) as (replica, recorded):
        (_, _), (engine, _), *_ = recorded["processes"]
        segment = next(path for path in recorded["shm"] if "psm_" in path)
        removed = leftovers.remove(recorded)
        assert ended(engine) and not os.path.exists(segment) and not own.exists()
        assert f"process {engine}" in removed and segment in removed
        assert replica.poll() is None  # Ray ends the replica itself


def test_a_reused_pid_and_another_hosts_record_are_left_alone():
    with replica_running() as (_, recorded):
        (_, _), (engine, _), *_ = recorded["processes"]
        reused = {**recorded, "processes": [[pid, created - 60] for pid, created in recorded["processes"]]}
        elsewhere = {**recorded, "host": "another-host"}
        assert leftovers.remove(elsewhere) == []
        assert (
            leftovers.remove(reused) == recorded["shm"]
        )  # none of the record's processes alive: segments go
        assert not ended(engine)  # its pid was recorded with another start time: not the same process


# A replica stand-in: starts the engine, records, waits.
REPLICA = f"""
import json, subprocess, sys, time
from prismserve.runtime import leftovers
engine = subprocess.Popen([sys.executable, "-c", {ENGINE!r}], stdout=subprocess.PIPE, text=True)
engine.stdout.readline()
print(json.dumps(leftovers.record([sys.argv[1]] if sys.argv[1] else [])), flush=True)
time.sleep(600)
"""


def test_the_replica_itself_is_left_to_its_stopper_unless_asked():
    with replica_running() as (replica, recorded):
        leftovers.remove(recorded)
        assert replica.poll() is None  # Ray ends the replica itself
        leftovers.remove(recorded, root=True)  # no Ray left to end it
        assert replica.wait(timeout=10) == -9


@contextlib.contextmanager
def replica_running(own: Path | None = None) -> Iterator[tuple[subprocess.Popen[str], dict]]:
    """A replica stand-in with its engine, and its record (recorded there: a record made in the test
    run's own process would hold the test run's Ray cluster, which removing would kill)."""
    replica = subprocess.Popen(
        [sys.executable, "-c", REPLICA, str(own or "")], stdout=subprocess.PIPE, text=True
    )
    recorded: dict = {}
    try:
        assert replica.stdout is not None
        recorded = json.loads(replica.stdout.readline())
        assert recorded["processes"][0][0] == replica.pid and len(recorded["processes"]) >= 2
        yield replica, recorded
    finally:
        replica.kill()
        replica.wait()
        for process in recorded.get("processes", [])[1:]:
            with contextlib.suppress(psutil.Error):
                psutil.Process(process[0]).kill()
        for path in recorded.get("shm", []):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def ended(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
