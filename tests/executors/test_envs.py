"""The vLLM environment's package link: replicas import this prismserve through it, and vLLM finds
prismserve's plugin there (a `vllm.general_plugins` entry point in a dist-info beside the link)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import prismserve
from prismserve.executors import envs, vllm_plugin


def _link_dir(monkeypatch, home: Path) -> Path:
    monkeypatch.setenv("HOME", str(home))  # the link directory lives under ~/.cache/prismserve
    monkeypatch.setenv("PRISMSERVE_VLLM_PYTHON", sys.executable)  # any Python: only env_vars matter here
    return Path(envs.runtime_env("vllm")["env_vars"]["PYTHONPATH"])


def test_the_replicas_path_links_this_package_and_declares_the_vllm_plugin(monkeypatch, tmp_path):
    link_dir = _link_dir(monkeypatch, tmp_path)
    assert link_dir.is_relative_to(tmp_path)
    assert (link_dir / "prismserve").resolve() == Path(prismserve.__file__).resolve().parent
    # What vLLM's plugin loader does (importlib.metadata's entry points), on the replica's path only.
    (dist,) = importlib.metadata.distributions(path=[str(link_dir)])
    (entry,) = [e for e in dist.entry_points if e.group == "vllm.general_plugins"]
    assert dist.metadata["Name"] == "prismserve-vllm-plugins"
    assert entry.load() is vllm_plugin.register


def test_the_dist_info_is_rewritten_when_damaged_and_left_alone_when_whole(monkeypatch, tmp_path):
    link_dir = _link_dir(monkeypatch, tmp_path)
    entry_points = link_dir / envs.PLUGIN_DIST / "entry_points.txt"
    written = entry_points.stat().st_mtime_ns
    assert _link_dir(monkeypatch, tmp_path) == link_dir and entry_points.stat().st_mtime_ns == written
    entry_points.write_text("[vllm.general_plugins]\n")  # e.g. an older prismserve's, or a torn write
    _link_dir(monkeypatch, tmp_path)
    assert entry_points.read_text() == envs.PLUGIN_FILES["entry_points.txt"]
    assert sorted(p.name for p in (link_dir / envs.PLUGIN_DIST).iterdir()) == sorted(envs.PLUGIN_FILES)
