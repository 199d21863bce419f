"""The sweep of prefill → decode hand-off folders: what it deletes and what it leaves."""

from __future__ import annotations

import os

from prismserve.executors.handoff import TAKEN, sweep_handoffs

NOW = 1_000_000.0


def _folder(root, name: str, age_s: float, taken: bool) -> None:
    path = root / name
    path.mkdir()
    (path / "layer.0.safetensors").write_bytes(b"kv")
    if taken:
        (path / TAKEN).touch()
    os.utime(path, (NOW - age_s, NOW - age_s))  # its last write or touch


def test_taken_handoffs_go_after_the_grace_and_untaken_ones_after_the_ttl(tmp_path):
    _folder(tmp_path, "waiting", 10, taken=False)  # its decode has not come yet
    _folder(tmp_path, "orphan", 400, taken=False)  # its decode never came
    _folder(tmp_path, "just-taken", 2, taken=True)  # another decode of the same prompt may still read it
    _folder(tmp_path, "taken", 10, taken=True)
    (tmp_path / "not-a-handoff").write_text("left alone")
    deleted = sweep_handoffs(str(tmp_path), ttl_s=300, grace_s=5, now=NOW)
    assert sorted(deleted) == ["orphan", "taken"]
    assert sorted(os.listdir(tmp_path)) == ["just-taken", "not-a-handoff", "waiting"]


def test_a_missing_directory_is_nothing_to_sweep(tmp_path):
    assert sweep_handoffs(str(tmp_path / "none"), ttl_s=300, grace_s=5) == []
