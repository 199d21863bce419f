"""Loading a replica's part of a checkpoint: straight onto the device through `device_map`, with the
same weights as transformers' plain `from_pretrained`, and Omni parts a replica does not run unread."""

from __future__ import annotations

import json
import shutil

import numpy as np
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


def test_a_component_loads_in_the_dtype_asked_and_auto_is_the_checkpoints(tiny_vl, small_png, tmp_path):
    """`auto` is the checkpoint's dtype, as vLLM runs it here (transformers' own default is float32,
    so a bfloat16 checkpoint's encoders ran in float32 beside a bfloat16 vLLM LLM); a dtype asked
    for wins; an encoder loaded in bfloat16 encodes, its embeddings leaving as float32."""
    cls = transformers.Qwen2_5_VLForConditionalGeneration
    assert load_pretrained(cls, tiny_vl, "cpu").dtype == torch.float32  # its config's dtype
    saved_in_bf16 = tmp_path / "bf16"
    shutil.copytree(tiny_vl, saved_in_bf16)
    config = json.loads((saved_in_bf16 / "config.json").read_text())
    (saved_in_bf16 / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    assert load_pretrained(cls, str(saved_in_bf16), "cpu").dtype == torch.bfloat16
    assert load_pretrained(cls, str(saved_in_bf16), "cpu", "float32").dtype == torch.float32
    adapter = adapter_for(tiny_vl, "cpu", "bfloat16")
    adapter.load_encoder("image")
    assert {p.dtype for p in adapter.model.parameters()} == {torch.bfloat16}
    (encoded,) = adapter.encode("image", [small_png])
    assert encoded.embeddings.dtype == np.float32 and np.isfinite(encoded.embeddings).all()
