"""How long a replica may take to start: the configured seconds, else 120 s plus 30 s per GiB of the
checkpoint's weights on disk, else a download's allowance."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from toy.tasks import EncoderTask

from prismserve.errors import ReplicaStartError
from prismserve.executors.loading import checkpoint_bytes, start_timeout_s
from prismserve.executors.spec import ExecutorSpec
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.task_manager import Placement, TaskManager
from prismserve.tasklib.units import EncoderTask as ModelEncoderTask
from prismserve.tasklib.units import ImageGeneratorTask


def sparse(path: Path, size: int) -> None:
    """A file of `size` bytes that takes no disk space (as `truncate -s` makes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        file.truncate(size)


@pytest.fixture(autouse=True)
def no_configured_timeout(monkeypatch):
    monkeypatch.delenv("PRISMSERVE_START_TIMEOUT_S", raising=False)


def test_a_2_gib_checkpoint_directory_gets_180_s_and_only_weight_files_count(tmp_path):
    sparse(tmp_path / "model-00001-of-00002.safetensors", 2**30)
    sparse(tmp_path / "model-00002-of-00002.safetensors", 2**30)
    sparse(tmp_path / "tokenizer.json", 2**30)  # not weights
    assert start_timeout_s(ModelEncoderTask(model=str(tmp_path), modality="image")) == 180.0


def test_a_pipelines_component_folders_count_too(tmp_path):
    sparse(tmp_path / "transformer" / "diffusion_pytorch_model.safetensors", 3 * 2**30)
    sparse(tmp_path / "vae" / "diffusion_pytorch_model.bin", 2**30)
    assert start_timeout_s(ImageGeneratorTask(model=str(tmp_path))) == 120.0 + 4 * 30.0


def test_a_hub_id_in_the_hub_cache_is_sized_and_one_not_there_gets_the_download_allowance(tmp_path):
    repo = tmp_path / "models--acme--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    sparse(repo / "blobs" / "abc", 2**30)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    os.symlink(repo / "blobs" / "abc", snapshot / "model.safetensors")  # as the hub cache links them
    assert checkpoint_bytes("acme/tiny", cache_dir=str(tmp_path)) == 2**30
    task = ModelEncoderTask(model="acme/tiny", modality="image")
    assert start_timeout_s(task, cache_dir=str(tmp_path)) == 150.0
    absent = ModelEncoderTask(model="acme/absent", modality="image")
    assert start_timeout_s(absent, cache_dir=str(tmp_path)) == 1800.0


def test_the_configured_seconds_win_and_a_task_without_checkpoint_gets_the_base(tmp_path, monkeypatch):
    sparse(tmp_path / "model.safetensors", 2**30)
    assert start_timeout_s(EncoderTask(model_id="m", modality="image")) == 120.0  # no `model`
    assert start_timeout_s(None) == 120.0
    monkeypatch.setenv("PRISMSERVE_START_TIMEOUT_S", "45")
    assert start_timeout_s(ModelEncoderTask(model=str(tmp_path), modality="image")) == 45.0
    monkeypatch.setenv("PRISMSERVE_START_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match=r"PRISMSERVE_START_TIMEOUT_S='soon' is not a number of seconds"):
        start_timeout_s(None)


class SlowPool(InProcessPool):
    """In-process replicas that take ten seconds to start, bounded by the start timeout as every pool is."""

    async def start(self, manager, replica) -> None:
        await asyncio.wait_for(asyncio.sleep(10.0), manager.start_timeout_s)


def test_a_replica_that_does_not_start_in_time_names_the_setting_to_raise():
    async def scenario():
        spec = ExecutorSpec(start_timeout_s=1.0)
        manager = TaskManager("enc", EncoderTask(model_id="m", modality="image"), spec, 0, pool=SlowPool())
        await manager.add_replica(Placement(None, 0, 1))

    with pytest.raises(ReplicaStartError, match=r"did not start within 1 s: set PRISMSERVE_START_TIMEOUT_S"):
        asyncio.run(scenario())
