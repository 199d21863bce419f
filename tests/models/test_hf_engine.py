"""The transformers engine's continuous batching: concurrent requests of different lengths (text,
image, audio; raw media and precomputed embeddings) each get what transformers' `generate` gives
them alone, and stay independent of each other."""

from __future__ import annotations

import base64
import threading
import time

import numpy as np
import pytest
import torch

from prismserve.executors.hf_engine import HFEngine
from prismserve.models import MediaInput, adapter_for
from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import conversation

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = ["qwen2.5-vl", "internvl3", "gemma3", "qwen2.5-omni", "qwen3-omni"]


def requests(cars_jpg: bytes, small_png: bytes, wav: bytes, family: str) -> list[ChatRequest]:
    """Prompts of different lengths and kinds: short and long text, one and two images, a spoken question."""
    chosen = [
        ChatRequest.of("A long text prompt that goes on about many different things. " * 6),
        ChatRequest.of("Describe the picture.", images=[cars_jpg]),
        ChatRequest.of("Hi"),
        ChatRequest.of("Compare them.", images=[cars_jpg, small_png]),
    ]
    if "omni" in family:
        audio = {"type": "audio", "data": base64.b64encode(wav).decode()}
        chosen.append(
            ChatRequest.model_validate(
                {"messages": [{"role": "user", "content": [audio, {"type": "text", "text": "Answer."}]}]}
            )
        )
    return chosen


def whole_feeds(talker, conditionings: list[dict]) -> list:
    """A talker's reply feeds of whole conditionings (every row there from the start)."""
    feeds = [talker.reply_feed(c) for c in conditionings]
    for feed in feeds:
        feed.close()
    return feeds


def staggered(engine: HFEngine, inputs: list[dict], lengths: list[int], **options) -> list:
    """Every request's Generated, in order, submitted as `staggered_streams` submits them; each
    streamed its ids as they were generated."""
    results, streams = staggered_streams(engine, inputs, lengths, **options)
    for result, stream in zip(results, streams, strict=True):
        assert stream == result.token_ids  # streamed as generated, in order
    return results


def staggered_streams(
    engine: HFEngine, inputs: list[dict], lengths: list[int], feeds: list | None = None, **options
) -> tuple[list, list[list]]:
    """Submit the first request, the others once it has streamed three items (they join a running
    batch); every request's Generated and what it streamed, in order (a talker's requests with their
    `feeds`)."""
    feeds = feeds or [None] * len(inputs)
    started = threading.Event()
    streams: list[list] = [[] for _ in inputs]

    def collect(index: int):
        def on_item(item) -> None:
            streams[index].append(item)
            if index == 0 and len(streams[0]) == 3:
                started.set()

        return on_item

    futures = [engine.submit(inputs[0], lengths[0], on_token=collect(0), feed=feeds[0], **options)]
    assert started.wait(120)
    futures += [
        engine.submit(i, n, on_token=collect(index), feed=f, **options)
        for index, (i, n, f) in enumerate(zip(inputs[1:], lengths[1:], feeds[1:], strict=True), start=1)
    ]
    return [f.result(timeout=300) for f in futures], streams


@pytest.fixture(scope="module", params=FAMILIES)
def monolith(request):
    from prismserve.models import tiny

    adapter = adapter_for(str(tiny.build(request.param)))
    adapter.load_llm(with_encoders=True)
    return adapter


def test_concurrent_requests_get_the_tokens_they_get_alone(monolith, cars_jpg, small_png, query_wav):
    family = monolith.family
    inputs = []
    for request in requests(cars_jpg, small_png, query_wav, family):
        messages, media = conversation(request)
        inputs.append(monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media]))
    lengths = [24, 9, 16, 5, 12][: len(inputs)]
    alone = [monolith.generate(i, n, with_logits=True) for i, n in zip(inputs, lengths, strict=True)]
    engine = HFEngine(monolith)
    try:
        batched = staggered(engine, inputs, lengths, with_logits=True)
        assert engine.peak_batch == len(inputs)  # all joined one running batch
    finally:
        engine.close()
    for one, other in zip(alone, batched, strict=True):
        assert other.token_ids == one.token_ids
        # Per-step logits, not only argmax: random weights hide wrong positions (M-RoPE offsets) in tokens.
        np.testing.assert_allclose(other.logits, one.logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen2.5-omni"])
def test_fissioned_llm_batches_embedding_prompts(family, cars_jpg, small_png, query_wav):
    """Prompts fed as precomputed encoder outputs (`inputs_embeds`, `mm_encoder_outputs`) batch too;
    the thinker's hidden states (the talker's conditioning) equal `generate`'s."""
    from prismserve.models import tiny

    path = str(tiny.build(family))
    encoder, llm = adapter_for(path), adapter_for(path)
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    chosen = requests(cars_jpg, small_png, query_wav, family)[:4]
    inputs = []
    for request in chosen:
        messages, media = conversation(request)
        encoded = encoder.encode("image", [m.data for m in media]) if media else []
        inputs.append(llm.llm_inputs(messages, encoded=encoded))
    lengths = [20, 7, 12, 9]
    speech = family == "qwen2.5-omni"
    alone = [
        llm.generate(i, n, with_logits=True, with_hidden=speech) for i, n in zip(inputs, lengths, strict=True)
    ]
    engine = HFEngine(llm)
    try:
        batched = staggered(engine, inputs, lengths, with_logits=True, with_hidden=speech)
    finally:
        engine.close()
    for one, other in zip(alone, batched, strict=True):
        assert other.token_ids == one.token_ids
        np.testing.assert_allclose(other.logits, one.logits, atol=1e-4, rtol=0)
        if speech:
            assert len(other.hidden_states) == len(one.hidden_states)
            for mine, theirs in zip(other.hidden_states, one.hidden_states, strict=True):
                for a, b in zip(mine, theirs, strict=True):
                    assert a.shape == b.shape
                    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_requests_stay_independent(tiny_vl, cars_jpg):
    """A cancelled request, a failing one and a sampled one (own temperature and seed) leave their
    neighbours' tokens unchanged; each ends at its own max_tokens."""
    adapter = adapter_for(tiny_vl)
    adapter.load_llm(with_encoders=True)
    messages, media = conversation(ChatRequest.of("Describe the picture.", images=[cars_jpg]))
    image = adapter.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    text = adapter.llm_inputs(conversation(ChatRequest.of("Tell me a story about a robot."))[0])
    expected_image = adapter.generate(image, 20).token_ids
    expected_text = adapter.generate(text, 11).token_ids
    engine = HFEngine(adapter)
    try:
        sampled_alone = engine.submit(text, 12, temperature=0.9, seed=7).result(timeout=300).token_ids
        cancel = threading.Event()
        futures = {
            "image": engine.submit(image, 20),
            "cancelled": engine.submit(text, 30, on_token=lambda _: cancel.set(), should_stop=cancel.is_set),
            "broken": engine.submit({"input_ids": torch.tensor([[10**7]])}, 5),
            "sampled": engine.submit(text, 12, temperature=0.9, seed=7),
            "text": engine.submit(text, 11),
        }
        with pytest.raises(IndexError):
            futures["broken"].result(timeout=300)
        results = {k: f.result(timeout=300).token_ids for k, f in futures.items() if k != "broken"}
    finally:
        engine.close()
    assert results["image"] == expected_image and results["text"] == expected_text
    assert len(results["cancelled"]) == 1  # stopped at its first token
    assert results["sampled"] == sampled_alone  # its own generator: neighbours do not move its draws
    assert results["sampled"] != expected_text[: len(results["sampled"])]  # really sampled


def test_talker_batches_as_generate_talks(tiny_omni, cars_jpg, small_png, query_wav):
    """Qwen2.5-Omni's talker in the engine (fed each step's thinker reply embedding, its own M-RoPE
    deltas and sampling rules) gives every request the codes and logits of the talker's `generate`."""
    thinker, talker = adapter_for(tiny_omni), adapter_for(tiny_omni)
    thinker.load_llm(with_encoders=True)
    talker.load_talker()
    speaker = thinker.speaker(None)
    conditionings = []
    for request in requests(cars_jpg, small_png, query_wav, "qwen2.5-omni")[
        1:
    ]:  # image, text, 2 images, audio
        messages, media = conversation(request)
        inputs = thinker.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
        conditionings.append(
            thinker.talker_inputs(inputs, thinker.generate(inputs, 6, with_hidden=True), speaker)
        )
    lengths = [40, 12, 30, 25]
    module = talker.model.talker
    alone = []
    for conditioning, n in zip(conditionings, lengths, strict=True):
        with torch.inference_mode():
            out = module.generate(
                **talker.talker_prompt(conditioning),
                **talker.talker_sampling(0.0),
                eos_token_id=[module.codec_pad_token, module.codec_eos_token],
                pad_token_id=module.codec_pad_token,
                max_new_tokens=n,
                output_logits=True,
                return_dict_in_generate=True,
            )
        alone.append(out)
        assert talker.talk(conditioning, n) == talker.until_end(out.sequences[0].tolist()[-len(out.logits) :])
    engine = HFEngine(talker.talker_model())
    try:
        prompts = [talker.talker_prompt(c) for c in conditionings]
        batched = staggered(
            engine, prompts, lengths, feeds=whole_feeds(talker, conditionings), with_logits=True
        )
        assert engine.peak_batch == len(prompts)
    finally:
        engine.close()
    for one, other in zip(alone, batched, strict=True):
        assert other.token_ids == one.sequences[0, -len(one.logits) :].tolist()
        assert len(set(other.token_ids)) > 3  # varied codes: a wrong step input would show
        np.testing.assert_allclose(other.logits, torch.cat(one.logits).numpy(), atol=1e-4, rtol=0)


def test_qwen3_talker_batches_frames_as_talk_makes_them(cars_jpg, small_png, query_wav):
    """Qwen3-Omni's talker in the engine (the code predictor run for the whole batch at every step,
    each row fed its own reply text at its own step, its own M-RoPE deltas and sampling rules)
    streams every request the frames `talk` (transformers' `generate`) makes for it alone, with
    `generate`'s logits at every step; a cancelled and a sampled neighbour change nothing."""
    from prismserve.models import tiny

    path = str(tiny.build("qwen3-omni"))
    thinker, talker = adapter_for(path), adapter_for(path)
    thinker.load_llm(with_encoders=True)
    talker.load_talker()
    speaker = thinker.speaker(None)
    chosen = requests(cars_jpg, small_png, query_wav, "qwen3-omni")
    conditionings = []
    # Text only, an image, a spoken question, two images; replies of different lengths, so that rows
    # run out of reply text (then take the pad) at different steps.
    for request, reply in zip([chosen[2], chosen[1], chosen[4], chosen[3]], [4, 9, 12, 6], strict=True):
        messages, media = conversation(request)
        inputs = thinker.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
        thought = thinker.generate(inputs, reply, with_hidden=True)
        conditionings.append(thinker.talker_inputs(inputs, thought, speaker))
    lengths = [30, 12, 24, 18]
    module = talker.model.talker
    alone, logits = [], []
    for conditioning, n in zip(conditionings, lengths, strict=True):
        alone.append(talker.talk(conditioning, n))
        with torch.inference_mode():
            out = module.generate(
                **talker.talker_prompt(conditioning),
                **talker.talker_sampling(0.0),
                eos_token_id=module.config.codec_eos_token_id,
                max_new_tokens=n,
                output_logits=True,
                output_hidden_states=True,
                return_dict_in_generate=True,
            )
        logits.append(torch.cat(out.logits).float().numpy())
    prompts = [talker.talker_prompt(c) for c in conditionings]
    engine = HFEngine(talker.talker_model())
    try:
        batched, streamed = staggered_streams(
            engine, prompts, lengths, feeds=whole_feeds(talker, conditionings), with_logits=True
        )
        assert engine.peak_batch == len(prompts)  # they really decoded together
        # Again, all at once, beside a request cancelled after its second frame and a sampled one.
        cancel = threading.Event()
        cancelled_frames: list = []

        def cancel_after_two(frame) -> None:
            cancelled_frames.append(frame)
            if len(cancelled_frames) == 2:
                cancel.set()

        first_feed, second_feed, *feeds = whole_feeds(talker, [conditionings[0]] * 2 + conditionings)
        cancelled = engine.submit(
            prompts[0], 30, on_token=cancel_after_two, should_stop=cancel.is_set, feed=first_feed
        )
        sampled_frames: list = []
        sampled = engine.submit(
            prompts[0], 30, temperature=0.9, seed=3, on_token=sampled_frames.append, feed=second_feed
        )
        again: list[list] = [[] for _ in prompts]
        futures = [
            engine.submit(p, n, on_token=a.append, feed=f)
            for p, n, a, f in zip(prompts, lengths, again, feeds, strict=True)
        ]
        for future in [cancelled, sampled, *futures]:
            future.result(timeout=300)
    finally:
        engine.close()
    for one, frames, result, expected, repeated in zip(alone, streamed, batched, logits, again, strict=True):
        assert frames == one and repeated == one
        assert len({tuple(f) for f in one}) > 3  # varied frames: not a comparison of constant streams
        assert [f[0] for f in one] == result.token_ids[:-1]  # codebook 0; the last id gets no frame
        # The logits show what the tiny talker's argmax hides: a row fed another row's reply text, or
        # its text a step off, or positions without its M-RoPE deltas, keeps its frames but not these.
        np.testing.assert_allclose(result.logits, expected, atol=1e-4, rtol=0)
    ends = [r.token_ids[-1] == module.config.codec_eos_token_id for r in batched]
    assert any(ends) and not all(ends)  # some end on the end token, others at their max_codes
    assert cancelled_frames == alone[0][:2] and len(cancelled.result().token_ids) == 3
    assert {len(f) for f in sampled_frames} == {len(alone[0][0])}
    assert sampled_frames != alone[0][: len(sampled_frames)]  # really sampled


@pytest.mark.parametrize("family", ["qwen2.5-omni", "qwen3-omni"])
def test_a_talker_fed_its_reply_as_the_thinker_makes_it_talks_as_on_the_whole_reply(
    family, cars_jpg, small_png, query_wav
):
    """The talker starts on the thinker's first conditioning item and is fed the rest row by row:
    it waits at each step whose reply row has not come (its neighbour decodes on meanwhile), and
    both get the codes and logits the talker's `generate` gives them on the whole conditioning."""
    from prismserve.models import tiny
    from prismserve.models.conditioning import merged

    path = str(tiny.build(family))
    thinker, talker = adapter_for(path), adapter_for(path)
    thinker.load_llm(with_encoders=True)
    talker.load_talker()
    speaker = thinker.speaker(None)
    streams = []
    for request in (
        ChatRequest.of("Describe the picture.", images=[cars_jpg]),
        ChatRequest.of("Tell me about the weather today."),
    ):
        messages, media = conversation(request)
        inputs = thinker.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
        thought = thinker.generate(inputs, 7, with_hidden=True)
        items: list[dict] = []  # the conditioning stream, as the thinker executor hands it out
        builder = thinker.conditioning(inputs, speaker, items.append)
        with torch.inference_mode():
            for token, states in zip(thought.token_ids, thought.hidden_states, strict=True):
                builder.add_token(token)
                builder.add_states(*thinker.talker_states(states))
        builder.finish()
        # The prompt with the first reply row, one item per token fed after it, the end. The tiny
        # tokenizer spells "assistant" in several tokens: Qwen3's reply text (from the assistant
        # turn's fourth position, as transformers reads it) then starts in the prompt, which alone
        # is enough for the first item.
        assert len(items) == len(thought.token_ids) + (family == "qwen3-omni")
        streams.append(items)
    assert len(streams[0]) >= 4  # steps to wait at
    whole = [merged(items) for items in streams]
    lengths = [40, 20]
    expected = []
    module = talker.model.talker
    for conditioning, n in zip(whole, lengths, strict=True):
        ends = module.config.codec_eos_token_id if family == "qwen3-omni" else module.codec_eos_token
        with torch.inference_mode():
            out = module.generate(
                **talker.talker_prompt(conditioning),
                **talker.talker_sampling(0.0),
                eos_token_id=ends,
                max_new_tokens=n,
                output_logits=True,
                output_hidden_states=True,
                return_dict_in_generate=True,
            )
        expected.append(torch.cat(out.logits).float().numpy())
    engine = HFEngine(talker.talker_model())
    streamed: list = []
    neighbour: list = []
    # Qwen3-Omni streams a frame one step after its codebook-0 id, Qwen2.5-Omni each id as it comes.
    lag = 0 if family == "qwen3-omni" else 1
    try:
        items = streams[0]
        feed = talker.reply_feed(items[0])
        first = engine.submit(
            talker.talker_prompt(items[0]), lengths[0], feed=feed, on_token=streamed.append, with_logits=True
        )
        whole_feed = talker.reply_feed(whole[1])
        whole_feed.close()
        second = engine.submit(
            talker.talker_prompt(whole[1]),
            lengths[1],
            feed=whole_feed,
            on_token=neighbour.append,
            with_logits=True,
        )
        rows = len(items[0]["reply_embeds"])
        for item in items[1:]:
            # Every step so far had its row: the request now waits at the next.
            deadline = time.monotonic() + 60
            while len(streamed) < rows + lag and time.monotonic() < deadline:
                time.sleep(0.01)
            before = len(neighbour)
            time.sleep(0.3)
            assert len(streamed) == rows + lag  # it waited for its next row ...
            assert len(neighbour) > before or second.done()  # ... while its neighbour decoded on
            feed.append(talker.reply_rows(item["reply_embeds"]))
            rows += len(item["reply_embeds"])
        feed.close()
        results = [first.result(timeout=120), second.result(timeout=120)]
    finally:
        engine.close()
    assert len(results[0].token_ids) > rows  # it talked past the reply
    for result, logits, conditioning, n in zip(results, expected, whole, lengths, strict=True):
        np.testing.assert_allclose(result.logits, logits, atol=1e-4, rtol=0)
        if family == "qwen2.5-omni":
            assert talker.until_end(result.token_ids) == talker.talk(conditioning, n)
