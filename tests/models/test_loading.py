"""Loading a replica's part of a checkpoint: straight onto the device through `device_map`, with the
same weights as transformers' plain `from_pretrained`, and Omni parts a replica does not run unread."""

from __future__ import annotations

import torch
import transformers

from prismserve.models import adapter_for
from prismserve.models.base import load_pretrained


def _same_weights(loaded: torch.nn.Module, reference: torch.nn.Module) -> None:
    got, want = loaded.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].device.type == "cpu" and torch.equal(got[name], tensor), name


def test_loading_onto_the_cpu_through_a_device_map_reads_the_plain_weights(tiny_vl):
    cls = transformers.Qwen2_5_VLForConditionalGeneration
    loaded = load_pretrained(cls, tiny_vl, "cpu")
    assert not loaded.training
    _same_weights(loaded, cls.from_pretrained(tiny_vl))


def test_an_omni_replica_without_the_talker_builds_neither_talker_nor_vocoder(tiny_omni):
    adapter = adapter_for(tiny_omni, "cpu")
    adapter.load_llm(with_encoders=True)
    assert not adapter.model.has_talker
    assert not hasattr(adapter.model, "talker") and not hasattr(adapter.model, "token2wav")
    whole = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_omni)
    _same_weights(adapter.model.thinker, whole.thinker)
