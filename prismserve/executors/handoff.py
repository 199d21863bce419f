"""The prefill → decode hand-off folders (`vllm_extensions.HandoffConnector` writes them) and their
sweep, which is what deletes them; no vLLM here, so the sweep runs and is tested anywhere."""

from __future__ import annotations

import contextlib
import os
import shutil
import time

TAKEN = ".taken"  # in a hand-off folder: a decode loaded it (or had the prompt cached) and finished
# The key of a prefill's `kv_transfer_params` (vLLM's output, at its end) naming the folder it saved to.
HANDOFF_FOLDER = "handoff_folder"


def mark_taken(folder: str) -> None:
    """Mark a hand-off folder done with (the sweep deletes it a grace period later); gone: nothing to do."""
    with contextlib.suppress(OSError), open(os.path.join(folder, TAKEN), "w"):
        pass


def sweep_handoffs(folder: str, ttl_s: float, grace_s: float, now: float | None = None) -> list[str]:
    """Delete the hand-offs in `folder` that are done with: taken more than `grace_s` ago, or
    untouched for `ttl_s` (no decode came: its request was cancelled, or its decode replica died).
    A folder's time is when it was last written or touched (each side touches the folder a request
    it schedules reuses or loads), so one about to be read is never old. Returns the names deleted."""
    now = time.time() if now is None else now
    deleted = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if not entry.is_dir():
                    continue
                age = now - entry.stat().st_mtime
                if age > ttl_s or (age > grace_s and os.path.exists(os.path.join(entry.path, TAKEN))):
                    shutil.rmtree(entry.path)
                    deleted.append(entry.name)
    return deleted
