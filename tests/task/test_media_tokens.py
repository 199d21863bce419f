"""Media tokens counted from an item's header as the model's processor counts them (token-aware routing)."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from prismserve.bench.workloads import workloads_dir
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import EncoderTask, LLMInput, LLMTask, MediaItem, MediaTokens
from prismserve.tasklib.media_tokens import internvl_tiles, qwen_image_tokens
from prismserve.tasklib.mllm import conversation


def test_qwen_counts_match_the_processors_own_resize():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    rng = random.Random(7)
    for _ in range(3000):
        width, height = rng.randint(10, 5000), rng.randint(10, 5000)
        if max(width, height) / min(width, height) > 150:
            continue
        h, w = smart_resize(height, width, 28, 56 * 56, 28 * 28 * 1280)
        assert qwen_image_tokens(width, height) == h * w // (28 * 28), (width, height)


def test_counts_by_rule_from_the_header_of_real_media():
    cars = (workloads_dir() / "media" / "cars.jpg").read_bytes()  # 3394 x 1830
    cough = (workloads_dir() / "media" / "cough.wav").read_bytes()
    assert MediaTokens().count("image", cars) == qwen_image_tokens(3394, 1830) <= 1280
    assert MediaTokens(image="tiles").count("image", cars) == 256 * internvl_tiles(3394, 1830)
    assert internvl_tiles(1920, 1080) == 9 and internvl_tiles(448, 448) == 1
    assert MediaTokens(image="fixed").count("image", cars) == 256
    import av

    with av.open(io.BytesIO(cough)) as clip:
        stream = clip.streams.audio[0]
        seconds = float(stream.duration * stream.time_base)
    assert MediaTokens().count("audio", cough) == pytest.approx(25 * seconds, abs=1)
    assert MediaTokens().count("image", b"not an image") == 256  # an estimate; the encoder refuses it


def test_an_llm_input_counts_its_text_and_every_media_item():
    out = io.BytesIO()
    Image.new("RGB", (280, 560), "white").save(out, format="PNG")
    request = ChatRequest.of("x" * 400, images=[out.getvalue()] * 2)
    messages, media = conversation(request)
    assert [m.tokens for m in media] == [200, 200] and media[0].pending_tokens() == 200
    assert LLMInput(conversation=messages, media=media).pending_tokens() == 100 + 400
    # An item not counted on arrival is counted when the dispatcher asks, by the default rule: the
    # task library's tasks know it, the task layer's input type does not.
    uncounted = MediaItem(modality="image", data=out.getvalue())
    assert EncoderTask(model="m", modality="image").pending_tokens(uncounted) == 200
    assert LLMTask(model="m").pending_tokens(LLMInput(conversation=messages, media=[uncounted])) == 100 + 200
    assert uncounted.pending_tokens() == 1 and uncounted.pending_tokens(MediaTokens().count) == 200
