"""Qwen2.5-VL split at the vision encoder: the fissioned path computes what the monolith computes."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from prismserve.executors.loading import InProcessExecutors
from prismserve.models import MediaError, MediaInput, adapter_for
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import InvalidInputError, use_dispatcher
from prismserve.tasklib import EncoderTask, LLMTask, MLLMTask, conversation, reply_text
from prismserve.tasklib.units import VLLMTask

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def parts(tiny_vl):
    encoder, llm, monolith = (adapter_for(tiny_vl) for _ in range(3))
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    monolith.load_llm(with_encoders=True)
    return encoder, llm, monolith


def test_fissioned_logits_equal_the_monoliths(parts, cars_jpg, small_png):
    encoder, llm, monolith = parts
    request = ChatRequest.of("Compare the two pictures.", images=[cars_jpg, small_png])
    messages, media = conversation(request)
    encoded = encoder.encode("image", [m.data for m in media])  # both images in one batch
    fissioned = llm.generate(llm.llm_inputs(messages, encoded=encoded), 12, with_logits=True)
    whole = monolith.generate(
        monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media]),
        12,
        with_logits=True,
    )
    assert fissioned.token_ids == whole.token_ids
    np.testing.assert_allclose(fissioned.logits, whole.logits, atol=1e-4, rtol=0)
    # The images' order matters: swapped embeddings give other logits (positions are not ignored).
    swapped = llm.generate(llm.llm_inputs(messages, encoded=encoded[::-1]), 1, with_logits=True)
    assert np.abs(swapped.logits[0] - whole.logits[0]).max() > 1e-4


def test_encoder_batches_equal_single_items(parts, cars_jpg, small_png):
    encoder, _, _ = parts
    batched = encoder.encode("image", [cars_jpg, small_png])
    alone = encoder.encode("image", [small_png])[0]
    assert batched[1].meta == alone.meta and batched[1].embeddings.shape == alone.embeddings.shape
    np.testing.assert_allclose(batched[1].embeddings, alone.embeddings, atol=1e-5)
    assert batched[0].embeddings.shape[0] == np.prod(batched[0].meta["grid_thw"]) // 4  # 2x2 merge


def test_llm_parts_hold_only_what_they_run(parts):
    encoder, llm, monolith = parts
    assert not hasattr(llm.model.model, "visual") and hasattr(monolith.model.model, "visual")
    assert type(encoder.model).__name__ == "Qwen2_5_VisionTransformerPretrainedModel"


def test_undecodable_image_is_a_media_error(parts):
    encoder, _, _ = parts
    with pytest.raises(MediaError, match="not a decodable image"):
        encoder.encode("image", [b"not an image"])


def _serve(executors: InProcessExecutors, task, request: ChatRequest) -> tuple[str, list]:
    graphs = []

    async def go() -> str:
        classes = {EncoderTask, LLMTask}
        with use_dispatcher(LocalDispatcher(executors.callables(classes), on_graph=graphs.append)):
            return await reply_text((await task(request)).text)

    return asyncio.run(go()), graphs


def test_mllm_task_fissioned_and_monolithic_stream_the_same_text(tiny_vl, cars_jpg, small_png):
    executors = InProcessExecutors()
    request = ChatRequest.of("What is in the picture?", images=[cars_jpg, small_png], max_tokens=10)
    fissioned, graphs = _serve(executors, MLLMTask(model=tiny_vl), request)
    whole, mono_graphs = _serve(executors, MLLMTask(model=tiny_vl, encoder_fission=False), request)
    assert fissioned == whole and fissioned
    assert [n.executor_kind for n in graphs[0].nodes] == ["mm-encoder", "mm-encoder", "mm-llm"]
    assert [n.executor_kind for n in mono_graphs[0].nodes] == ["mm-llm"]
    text_only, graphs = _serve(executors, MLLMTask(model=tiny_vl), ChatRequest.of("Hello", max_tokens=4))
    assert [n.executor_kind for n in graphs[0].nodes] == ["mm-llm"] and text_only


def test_concurrent_encoder_calls_share_a_batch(tiny_vl, cars_jpg, small_png):
    executors = InProcessExecutors()
    task = EncoderTask(model=tiny_vl, modality="image", cache_mib=0)  # every item encoded

    async def go():
        executor = await executors.get(task)
        calls = []
        original = executor.adapter.encode
        executor.adapter.encode = lambda modality, items: (
            calls.append(len(items)) or original(modality, items)
        )
        items = [{"modality": "image", "data": d} for d in (cars_jpg, small_png, cars_jpg)]
        outputs = await asyncio.gather(*(executor.run(item) for item in items))
        return calls, outputs

    calls, outputs = asyncio.run(go())
    assert sum(calls) == 3 and len(calls) < 3  # at least two items shared a forward pass
    assert np.array_equal(outputs[0].embeddings, outputs[2].embeddings)


def test_an_item_seen_before_is_not_encoded_again_and_the_cache_keeps_to_its_bound(
    tiny_vl, cars_jpg, small_png
):
    """A conversation's second turn sends its first turn's image again: its output comes from the
    cache, equal to the encoder's, while the same item in flight twice is encoded once."""
    executors = InProcessExecutors()
    task = EncoderTask(model=tiny_vl, modality="image")

    async def go():
        executor = await executors.get(task)
        calls = []
        original = executor.adapter.encode
        executor.adapter.encode = lambda modality, items: calls.extend(items) or original(modality, items)
        first = await executor.run({"modality": "image", "data": cars_jpg})
        again, other = await asyncio.gather(
            executor.run({"modality": "image", "data": cars_jpg}),
            executor.run({"modality": "image", "data": small_png}),
        )
        broken = {"modality": "image", "data": b"not an image"}
        twice = await asyncio.gather(executor.run(broken), executor.run(broken), return_exceptions=True)
        return calls, first, again, other, twice, executor.cache

    calls, first, again, other, twice, cache = asyncio.run(go())
    assert calls.count(cars_jpg) == 1 and calls.count(small_png) == 1
    assert np.array_equal(again.embeddings, first.embeddings) and again.meta.value == first.meta.value
    assert not np.array_equal(other.embeddings, first.embeddings)
    # A broken item in flight twice: tried once, both calls refused as the request's fault, not kept.
    assert calls.count(b"not an image") == 1 and all(isinstance(t, InvalidInputError) for t in twice)
    assert (cache.hits, cache.misses, len(cache)) == (2, 3, 2)


def test_bad_image_is_rejected_and_the_deployment_keeps_serving(tiny_vl, small_png):
    executors = InProcessExecutors()
    # The request's fault, named as on the Ray runtime (the gateway answers 400).
    with pytest.raises(
        InvalidInputError, match=r"call #0 \(EncoderTask\) rejected its input: not a decodable image"
    ):
        _serve(executors, MLLMTask(model=tiny_vl), ChatRequest.of("look", images=[b"\x89PNG broken"]))
    text, _ = _serve(
        executors, MLLMTask(model=tiny_vl), ChatRequest.of("look", images=[small_png], max_tokens=3)
    )
    assert text


def test_unsupported_modality_is_refused_while_recording(tiny_vl):
    request = ChatRequest.of("listen", audios=[b"RIFF...."])
    with pytest.raises(InvalidInputError, match="takes image input, not audio"):
        MLLMTask(model=tiny_vl).record(request)


def test_vllm_tasks_are_refused_in_process(tiny_vl):
    # vLLM runs only in its own environment, which the Ray runtime starts replicas in.
    with pytest.raises(RuntimeError, match="VLLMTask runs in the vllm environment, not in this process"):
        asyncio.run(InProcessExecutors().get(VLLMTask(model=tiny_vl)))


def test_video_clip_fissioned_equals_the_monolith(parts, cars_jpg):
    """A clip (frames paired per temporal patch) and an image: the encoder's embeddings, grids and
    seconds per temporal patch give the monolith's tokens and logits."""
    from prismserve.bench.payloads import video_url
    from prismserve.bench.workloads import workloads_dir

    clip = base64.b64decode(video_url(str(workloads_dir()), frames=6).split(",", 1)[1])
    encoder, llm, monolith = parts
    messages, media = conversation(ChatRequest.of("What happens?", videos=[clip], images=[cars_jpg]))
    assert [m.modality for m in media] == ["image", "video"]
    encoded = [encoder.encode(m.modality, [m.data])[0] for m in media]
    video = encoded[1]
    # 6 frames 0.1 s apart, sampled as Qwen2-VL's processor does at 2 fps: its 4-frame minimum
    # (indices 0, 1, 3, 4), so 2 temporal patches of 2 * 0.6 s / 4.
    assert video.meta["grid_thw"][0] == 2 and video.meta["second_per_grid"] == pytest.approx(0.3)
    fissioned = llm.generate(llm.llm_inputs(messages, encoded=encoded), 8, with_logits=True)
    whole = monolith.generate(
        monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media]),
        8,
        with_logits=True,
    )
    assert fissioned.token_ids == whole.token_ids
    np.testing.assert_allclose(fissioned.logits, whole.logits, atol=1e-4, rtol=0)
    # The clip's timing reaches the LLM's positions.
    video.meta = {**video.meta, "second_per_grid": 4.0}
    slower = llm.generate(llm.llm_inputs(messages, encoded=encoded), 1, with_logits=True)
    assert np.abs(slower.logits[0] - whole.logits[0]).max() > 1e-4
    with pytest.raises(MediaError, match="not a decodable video clip"):
        encoder.encode("video", [b"GIF89a broken"])
