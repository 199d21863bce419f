"""Which device model replicas run on: PRISMSERVE_DEVICE, else what torch sees, and never the CPU
unnoticed on GPUs Ray gave a replica."""

from __future__ import annotations

import pytest
import torch

from prismserve.errors import ReplicaStartError
from prismserve.executors.loading import check_device, cuda_index, memory_fraction
from prismserve.models.base import default_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")


def test_the_device_variable_wins_and_empty_means_unset(monkeypatch):
    monkeypatch.setenv("PRISMSERVE_DEVICE", "cpu")
    assert default_device() == "cpu"
    monkeypatch.setenv("PRISMSERVE_DEVICE", "cuda:1")
    assert default_device() == "cuda:1"
    monkeypatch.setenv("PRISMSERVE_DEVICE", "")
    assert default_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("PRISMSERVE_DEVICE", "gpu")
    with pytest.raises(
        ValueError, match=r"PRISMSERVE_DEVICE='gpu' names no device: set it to cpu, cuda or cuda:N"
    ):
        default_device()


@no_cuda
def test_a_replica_given_gpus_without_cuda_is_refused_unless_the_cpu_is_asked_for(monkeypatch):
    monkeypatch.delenv("PRISMSERVE_DEVICE", raising=False)
    check_device("EncoderTask (k)", [])  # no GPU given: the CPU is where it belongs
    with pytest.raises(ReplicaStartError) as refused:
        check_device("EncoderTask (k)", ["3"])
    assert str(refused.value) == (
        f"a replica of EncoderTask (k) was placed on GPUs 3 but torch {torch.__version__} (a CPU build) sees no "
        "CUDA device: install a CUDA build of torch, or serve with --fake-gpus / set PRISMSERVE_DEVICE=cpu to "
        "run on the CPU with declared GPUs"
    )
    monkeypatch.setenv("PRISMSERVE_DEVICE", "cuda")
    with pytest.raises(ReplicaStartError):
        check_device("EncoderTask (k)", ["3"])
    monkeypatch.setenv("PRISMSERVE_DEVICE", "cpu")
    check_device("EncoderTask (k)", ["3"])


def test_a_replica_with_a_share_of_a_cuda_gpu_is_held_to_that_share_of_its_memory():
    assert memory_fraction(0.3, "cuda") == 0.3 and memory_fraction(0.3, "cuda:0") == 0.3
    assert memory_fraction(1, "cuda") is None  # a whole GPU: all of it
    assert memory_fraction(0, "cuda") is None and memory_fraction(0.3, "cpu") is None


def test_the_share_is_set_on_the_cuda_device_the_replica_loads_on(monkeypatch):
    """Found by the GPU check on an H200: the share was set with `torch.device("cuda")`, which
    `torch.cuda.set_per_process_memory_fraction` refuses (ValueError: it needs an index), so every
    replica given part of a GPU failed to start. A bare "cuda" is the current device."""
    from torch.cuda._utils import _get_device_index  # the check that refused torch.device("cuda")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)  # a GPU torch would see: none here
    assert cuda_index("cuda") == 2 and _get_device_index(cuda_index("cuda")) == 2
    assert cuda_index("cuda:1") == 1
