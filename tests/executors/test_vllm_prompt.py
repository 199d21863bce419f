"""The vLLM executors build their prompts without holding the replica's event loop: raw media is
decoded in a worker thread. No engine is started (the prompt needs the tokenizer and the family's
adapter only)."""

from __future__ import annotations

import asyncio
import time

import pytest
from transformers import AutoTokenizer

from prismserve.bench.workloads import workloads_dir
from prismserve.errors import InvalidInputError
from prismserve.executors.vllm_llm import VLLMExecutor
from prismserve.models import adapter_for, tiny
from prismserve.models.media import load_image
from prismserve.task.components import LLMInput, MediaItem
from prismserve.tasklib.units import VLLMTask

CONVERSATION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]


def executor() -> VLLMExecutor:
    path = str(tiny.build("qwen2.5-vl"))
    built = VLLMExecutor(VLLMTask(model=path, with_encoders=True))
    built.tokenizer, built.adapter = AutoTokenizer.from_pretrained(path), adapter_for(path)
    return built


async def longest_stall(work: asyncio.Future, tick_s: float = 0.001) -> float:
    """The longest the event loop went without running a 1 ms ticker while `work` ran."""
    longest, last = 0.0, time.perf_counter()
    while not work.done():
        await asyncio.sleep(tick_s)
        now = time.perf_counter()
        longest, last = max(longest, now - last - tick_s), now
    await work
    return longest


def test_a_photos_decoding_does_not_hold_the_event_loop():
    photo = (workloads_dir() / "media" / "cars.jpg").read_bytes()
    decode_s = min(_timed(load_image, photo) for _ in range(3))
    # Four photos: decoded on the loop, the ticker would wait out all four (40 ms and more); in a
    # thread, the loop waits at most for the GIL's switches, however many photos there are (one
    # photo's half, the bound before, was within that noise on a fast machine in a loaded run).
    photos = [MediaItem(modality="image", data=photo)] * 4
    request = LLMInput(conversation=CONVERSATION * 4, media=photos)
    built = executor()

    async def main() -> tuple[dict, float]:
        work = asyncio.ensure_future(built.prompt(request))
        return work, await longest_stall(work)

    work, stall = asyncio.run(main())
    assert [image.size for image in work.result()["multi_modal_data"]["image"]] == [(3394, 1830)] * 4
    assert stall < 2 * decode_s, (stall, decode_s)


def test_media_that_cannot_be_decoded_is_the_requests_fault():
    request = LLMInput(conversation=CONVERSATION, media=[MediaItem(modality="image", data=b"not an image")])
    with pytest.raises(InvalidInputError, match="not a decodable image"):
        asyncio.run(executor().prompt(request))


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start
