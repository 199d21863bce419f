"""Media tokens counted as the checkpoint's own processor makes them: its pixel bounds and patch,
not Qwen's recommended defaults (the tiny checkpoints make at most 16 tokens of an image)."""

from __future__ import annotations

import io

from PIL import Image
from transformers import Qwen2VLImageProcessor

from prismserve.models import tiny
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import MediaTokens, MLLMTask, OmniTask
from prismserve.tasklib.mllm import conversation

SIZES = [(1280, 690), (690, 1280), (64, 64), (3394, 1830), (300, 30)]


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, format="PNG")
    return out.getvalue()


def processor_tokens(checkpoint: str, width: int, height: int) -> int:
    """Tokens the checkpoint's transformers image processor makes of a `width` x `height` image."""
    processor = Qwen2VLImageProcessor.from_pretrained(checkpoint)
    image = Image.new("RGB", (width, height), "white")
    grid = processor(images=[image], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod()) // processor.merge_size**2


def test_an_image_counts_as_many_tokens_as_the_checkpoints_processor_makes(tiny_vl):
    qwen3 = str(tiny.build("qwen3-omni"))  # a 32-px token (16-px patches), not Qwen2.5's 28
    for checkpoint in (tiny_vl, qwen3):
        counting = MediaTokens().of_checkpoint(checkpoint)
        counts = [counting.count("image", png(w, h)) for w, h in SIZES]
        assert counts == [processor_tokens(checkpoint, w, h) for w, h in SIZES], checkpoint
        assert max(counts) <= 16 < MediaTokens().count("image", png(1280, 690))


def test_an_mllm_task_counts_by_its_checkpoint_and_what_the_app_sets_wins(tiny_vl):
    request = ChatRequest.of("what is it", images=[png(1280, 690)])
    _, media = conversation(request, MLLMTask(model=tiny_vl).counting)
    assert [m.tokens for m in media] == [processor_tokens(tiny_vl, 1280, 690)]
    mine = MLLMTask(model=tiny_vl, media_tokens=MediaTokens(max_pixels=28 * 28 * 100)).counting
    assert mine.max_pixels == 28 * 28 * 100 and mine.patch_px == 28 and mine.min_pixels == 3136
    # A checkpoint not on this machine: the defaults, as before.
    assert MediaTokens().of_checkpoint("nobody/not-here") == MediaTokens()


def test_an_omni_task_counts_by_its_checkpoint_split_or_whole():
    """The Omni thinker's prompt carries each image's tokens as the checkpoint's processor makes
    them, with encoders apart or not (it was counted by Qwen's defaults: 1,150 tokens where the
    tiny Qwen3-Omni makes 8)."""
    qwen3 = str(tiny.build("qwen3-omni"))
    request = ChatRequest.of("what is it", images=[png(1280, 690)])
    made = processor_tokens(qwen3, 1280, 690)
    for fission in (False, True):
        graph = OmniTask(model=qwen3, encoder_fission=fission).record(request)
        (thinker,) = [i for i in graph if type(i.task).__name__ == "ThinkerTask"]
        items = thinker.input.encoded if fission else thinker.input.media
        assert [item.tokens for item in items] == [made], fission
