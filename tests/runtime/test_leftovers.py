"""What a replica leaves when it dies uncleanly (an engine's processes, their shared memory) is
recorded at start and removed at stop; a pid reused since, or another host's record, is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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


def start_engine() -> tuple[subprocess.Popen[str], str]:
    engine = subprocess.Popen([sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, text=True)
    assert engine.stdout is not None
    return engine, f"/dev/shm/{engine.stdout.readline().strip()}"


def test_an_engine_left_running_is_killed_and_its_shared_memory_unlinked(tmp_path):
    engine, segment = start_engine()
    own = tmp_path / "slab"
    own.write_bytes(b"x")
    try:
        recorded = leftovers.record([str(own)])
        assert segment in recorded["shm"] and [engine.pid, psutil.Process(engine.pid).create_time()] in [
            list(p) for p in recorded["processes"]
        ]
        removed = leftovers.remove(recorded)
        engine.wait(timeout=10)  # gone (psutil reaped it: its status is lost to Popen)
        assert not os.path.exists(segment) and not own.exists()
        assert f"process {engine.pid}" in removed and segment in removed
        assert psutil.pid_exists(os.getpid())  # the recording process spares itself
    finally:
        engine.kill()
        if os.path.exists(segment):
            os.unlink(segment)


def test_a_reused_pid_and_another_hosts_record_are_left_alone():
    engine, segment = start_engine()
    try:
        recorded = leftovers.record()
        reused = {**recorded, "processes": [[pid, created - 60] for pid, created in recorded["processes"]]}
        elsewhere = {**recorded, "host": "another-host"}
        assert leftovers.remove(elsewhere) == []
        assert leftovers.remove(reused) == [segment]  # no process of the record is alive: segments go
        time.sleep(0.2)
        assert engine.poll() is None  # its pid was recorded with another start time: not the same process
    finally:
        engine.kill()
        engine.wait()
        if os.path.exists(segment):
            os.unlink(segment)
