"""The tiny-model builder: offline checkpoints that load through `from_pretrained`, built once."""

from __future__ import annotations

import pytest

from prismserve.cli import main
from prismserve.models import adapter_for, tiny


def test_tiny_command_builds_once_into_the_cache(tmp_path, capsys):
    assert main(["tiny", "qwen2.5-vl", "--dir", str(tmp_path)]) == 0
    family, path = capsys.readouterr().out.strip().split("\t")
    assert family == "qwen2.5-vl" and path == str(tmp_path / f"qwen2.5-vl-v{tiny.FORMAT}")
    stamp = (tmp_path / path / "model.safetensors").stat().st_mtime_ns
    assert tiny.build("qwen2.5-vl", tmp_path) == tmp_path / path
    assert (tmp_path / path / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch left behind
    adapter = adapter_for(path)
    assert adapter.family == "qwen2.5-vl"
    assert adapter.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    ).endswith("<|im_end|>\n")


def test_unknown_family_is_refused(capsys):
    assert main(["tiny", "no-such-model"]) == 2
    assert "no tiny builder for ['no-such-model']" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no tiny builder"):
        tiny.build("no-such-model")


def test_checkpoint_of_an_unsupported_family_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    from prismserve.models import UnknownModelError

    with pytest.raises(UnknownModelError, match="no model family takes model_type 'bert'"):
        adapter_for(str(tmp_path))


def test_builds_are_reproducible(tmp_path):
    # Every weight comes from the seeded initialisation (the Qwen3-Omni talker's experts, which
    # transformers leaves uninitialised, included): two builds are byte for byte the same.
    first, second = (tiny.build("qwen3-omni", tmp_path / name) for name in ("a", "b"))
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
