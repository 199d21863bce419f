"""Tiny random-weight checkpoints, built offline and loaded back through the real `from_pretrained` path.

Each family's checkpoint is written once into a cache directory (`$PRISMSERVE_TINY_CACHE`, default
`~/.cache/prismserve/tiny`) with an offline byte-level BPE tokenizer, a chat template and the
family's preprocessor configuration, so tests and the demo run with no model hub.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prismserve.offline import disable_telemetry

# Bump when what a builder writes changes: older cached checkpoints are then rebuilt.
FORMAT = 1

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
    "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>",
]  # fmt: skip

# Qwen-style ChatML; media parts become the family's placeholder tokens.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = """prismserve serves any-to-any multimodal models: encoders for images, video and audio, one
or more language models, and generators of speech and images. Requests with different input and
output modalities take different paths through those components. What is in the picture? Describe
the sound. The cars are parked on a street; a red car, a blue car and a white van. Thank you.
"""


def cache_dir() -> Path:
    """Where tiny checkpoints are kept."""
    return Path(os.environ.get("PRISMSERVE_TINY_CACHE") or Path.home() / ".cache" / "prismserve" / "tiny")


def tokenizer() -> Any:
    """A byte-level BPE tokenizer (about 600 tokens) with the Qwen special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([_CORPUS] * 4, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _qwen2_5_vl(out: Path) -> None:
    import torch
    from transformers import AutoImageProcessor, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
            "window_size": 56,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(out)
    tok.save_pretrained(out)
    # Small images (at most 8x8 patches of 14 px) keep the encoder fast on a CPU.
    Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112}).save_pretrained(out)
    AutoImageProcessor.from_pretrained(out)  # fails now, not in a replica, if the files do not load


BUILDERS: dict[str, Callable[[Path], None]] = {
    "qwen2.5-vl": _qwen2_5_vl,
}
"""Family name -> function writing a tiny checkpoint into an empty directory."""


def build(family: str, root: Path | None = None) -> Path:
    """The directory of `family`'s tiny checkpoint, built on first use."""
    if family not in BUILDERS:
        raise ValueError(f"no tiny builder for {family!r}; families: {sorted(BUILDERS)}")
    disable_telemetry()
    root = root or cache_dir()
    target = root / f"{family}-v{FORMAT}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=root))
    try:
        BUILDERS[family](scratch)
        try:
            scratch.rename(target)  # atomic: a reader sees a whole checkpoint or none
        except OSError:
            if not (target / "config.json").is_file():  # not just another process that finished first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
