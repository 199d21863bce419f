"""Qwen2.5-Omni split into encoders, thinker, talker and vocoder computes what transformers' own
end-to-end `generate` computes (the monolith): the same text, codec ids and audio."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from media_clips import video_with_sound
from vllm_jobs import check_vllm_thinker, check_vllm_thinker_prefill_decode, omni_cases

from prismserve.executors.loading import InProcessExecutors
from prismserve.executors.spec import ExecutorSpec
from prismserve.models import MediaError, MediaInput, adapter_for
from prismserve.models.qwen2_5_omni import Slot
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.dispatcher import ReplicaDispatcher
from prismserve.runtime.local import LocalDispatcher
from prismserve.runtime.pool import InProcessPool
from prismserve.runtime.task_manager import Placement, TaskManager
from prismserve.task import InvalidInputError, TaskDefinitionError, use_dispatcher
from prismserve.task.context import RequestContext, RequestLedger, use_request
from prismserve.tasklib import conversation, reply_text
from prismserve.tasklib.omni import OmniTask
from prismserve.tasklib.units import (
    EncoderTask,
    OmniMonolithTask,
    TalkerTask,
    ThinkerTask,
    VocoderTask,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLASSES = {EncoderTask, ThinkerTask, TalkerTask, VocoderTask, OmniMonolithTask}


def loaded_parts(path: str) -> dict[str, Any]:
    """An Omni checkpoint's adapters by part, each loaded alone: encoders, thinker, talker, vocoder,
    and the monolith (transformers' whole model)."""
    adapters = {
        name: adapter_for(path)
        for name in ("image", "video", "audio", "thinker", "talker", "vocoder", "monolith")
    }
    for modality in ("image", "video", "audio"):
        adapters[modality].load_encoder(modality)
    adapters["thinker"].load_llm(with_encoders=False)
    adapters["talker"].load_talker()
    adapters["vocoder"].load_vocoder()
    adapters["monolith"].load_monolith()
    return adapters


@pytest.fixture(scope="module")
def parts(tiny_omni):
    return loaded_parts(tiny_omni)


def test_split_model_equals_transformers_generate(parts, cars_jpg, query_wav):
    request = ChatRequest.of("Answer the question about the picture.", images=[cars_jpg], audios=[query_wav])
    messages, media = conversation(request)
    monolith = parts["monolith"]
    raw = monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    speaker = monolith.speaker(None)
    whole_tokens, whole_wav = monolith.generate_all(raw, 10, 60, speaker, seed=7)
    whole_logits = monolith.generate(raw, 10, with_logits=True).logits

    encoded = [parts[m.modality].encode(m.modality, [m.data])[0] for m in media]
    thinker = parts["thinker"]
    inputs = thinker.llm_inputs(messages, encoded=encoded)
    thought = thinker.generate(inputs, 10, with_logits=True, with_hidden=True)
    assert thought.token_ids == whole_tokens
    np.testing.assert_allclose(thought.logits, whole_logits, atol=1e-4, rtol=0)
    codes = parts["talker"].talk(thinker.talker_inputs(inputs, thought, speaker), 60)
    wav = parts["vocoder"].vocode(codes, speaker, seed=7)
    assert wav.shape == whole_wav.shape and len(wav) == 480 * len(
        codes
    )  # 2 mel frames of 240 samples per code
    peak = np.abs(whole_wav).max()
    assert peak > 0.05  # audible: the comparison below is not between silences
    np.testing.assert_allclose(wav, whole_wav, atol=1e-4 * peak, rtol=0)
    # The vocoder's noise is what the seed fixes: another seed, other audio.
    assert np.abs(parts["vocoder"].vocode(codes, speaker, seed=8) - wav).max() > 1e-2 * peak


def test_a_video_with_its_soundtrack_split_equals_transformers_generate(parts, cars_jpg, query_wav):
    """A video whose soundtrack goes in too (`use_audio_in_video`) beside an image and an audio clip:
    the split (the vision tower on the clip, the audio tower on its soundtrack, the thinker laying
    them out interleaved) computes what transformers' `generate` computes on the raw media, text,
    logits, codec ids and audio; and the soundtrack changes the answer."""
    clip = video_with_sound(30)  # 3 s: two 2-second chunks
    request = ChatRequest.of(
        "What happens in the clip?",
        images=[cars_jpg],
        audios=[query_wav],
        videos=[clip],
        use_audio_in_video=True,
    )
    messages, media = conversation(request)
    assert [m.modality for m in media] == [
        "image",
        "audio",
        "video",
        "audio",
    ]  # the soundtrack after its video
    monolith = parts["monolith"]
    raw = monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    assert raw["use_audio_in_video"] is True
    speaker = monolith.speaker(None)
    whole_tokens, whole_wav = monolith.generate_all(raw, 8, 40, speaker, seed=7)
    whole_logits = monolith.generate(raw, 8, with_logits=True).logits

    encoded = [parts[m.modality].encode(m.modality, [m.data])[0] for m in media]
    assert encoded[2].meta["second_per_grid"] == 1.0 and len(encoded[3].embeddings) == 75  # 3 s of audio
    thinker = parts["thinker"]
    inputs = thinker.llm_inputs(messages, encoded=encoded)
    assert torch.equal(inputs["input_ids"].cpu(), raw["input_ids"].cpu())
    thought = thinker.generate(inputs, 8, with_logits=True, with_hidden=True)
    assert thought.token_ids == whole_tokens
    np.testing.assert_allclose(thought.logits, whole_logits, atol=1e-4, rtol=0)
    codes = parts["talker"].talk(thinker.talker_inputs(inputs, thought, speaker), 40)
    wav = parts["vocoder"].vocode(codes, speaker, seed=7)
    peak = np.abs(whole_wav).max()
    assert wav.shape == whole_wav.shape and peak > 0.05
    np.testing.assert_allclose(wav, whole_wav, atol=1e-4 * peak, rtol=0)

    silent = conversation(request.model_copy(update={"use_audio_in_video": False}))
    assert [m.modality for m in silent[1]] == ["image", "audio", "video"]
    alone = thinker.llm_inputs(silent[0], encoded=encoded[:3])
    assert "use_audio_in_video" not in alone
    assert alone["input_ids"].shape[1] == inputs["input_ids"].shape[1] - 75 - 2  # its tokens, start and end
    assert np.abs(thinker.generate(alone, 1, with_logits=True).logits[0] - thought.logits[0]).max() > 1e-3


@pytest.mark.parametrize(("frames", "seconds", "audio_tokens"), [(2, 1.0, 30), (6, 1.0, 150), (4, 0.5, 120)])
def test_the_soundtrack_is_interleaved_as_the_models_processor_does_it(parts, frames, seconds, audio_tokens):
    """The thinker's layout of a video and its soundtrack is the one transformers' processor writes
    (`replace_video_with_audio_token`, given the grid; its video processor, which needs torchvision,
    only lends its merge size: the image processor's)."""
    thinker = parts["thinker"]
    processor = thinker.processor
    grid = [frames, 8, 12]
    video = {"video_grid_thw": torch.tensor([grid]), "video_second_per_grid": [seconds]}
    audio = {"num_audio_tokens": [audio_tokens]}
    original = processor.video_processor
    processor.video_processor = processor.image_processor
    try:
        expected = processor.replace_video_with_audio_token(
            video, 0, audio, 0, position_id_per_seconds=25, seconds_per_chunk=2.0
        )
    finally:
        processor.video_processor = original
    placeholder = thinker.soundtrack_placeholder(Slot("video", frames * 24, grid, seconds), audio_tokens)
    assert placeholder == expected and placeholder.count(processor.audio_token) == audio_tokens


def test_inputs_built_without_the_processor_are_the_processors(parts, cars_jpg, query_wav):
    """The raw inputs built for requests with video (the processor takes none here) are, for an image
    and an audio clip, exactly what the model's processor makes."""
    request = ChatRequest.of("Answer.", images=[cars_jpg], audios=[query_wav, query_wav])
    messages, media = conversation(request)
    raw = [MediaInput(m.modality, m.data) for m in media]
    monolith = parts["monolith"]
    built = monolith.built_inputs(
        monolith.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), raw
    )
    processed = monolith.llm_inputs(messages, media=raw)
    assert sorted(built) == sorted(processed)
    for name, value in processed.items():
        assert torch.equal(built[name], value), name


def streamed(vocoder, codes: list, speaker: str, seed: int, per_push: int) -> tuple[np.ndarray, int]:
    """A streaming decode of `codes` pushed `per_push` at a time: the audio, and how many codes had
    been pushed when the first audio came out."""
    stream, parts, first = vocoder.vocoder_stream(speaker, seed), [], 0
    for start in range(0, len(codes), per_push):
        parts.append(stream.push(codes[start : start + per_push]))
        first = first or (start + per_push if len(parts[-1]) else 0)
    parts.append(stream.finish())
    return np.concatenate(parts), first or len(codes)


def test_streaming_token2wav_decodes_as_the_whole_utterance(parts):
    """Chunked token2wav (DiT windows with the blocks their attention reaches, BigVGAN with context)
    gives the whole utterance's audio; the first audio needs one chunk of codes, not all of them."""
    vocoder = parts["vocoder"]
    speaker = vocoder.speaker(None)
    codes = np.random.default_rng(0).integers(0, 59, 200).tolist()  # 4 s of speech
    whole = vocoder.vocode(codes, speaker, seed=3)
    audio, first = streamed(vocoder, codes, speaker, 3, per_push=25)  # as the talker sends them
    assert first == 50  # 36 codes of chunk + 12 of look-ahead, arriving in pushes of 25
    peak = np.abs(whole).max()
    assert audio.shape == whole.shape and peak > 0.05
    np.testing.assert_allclose(audio, whole, atol=1e-5 * peak, rtol=0)
    # An utterance within the first chunk is one window: exactly the whole decode.
    np.testing.assert_array_equal(
        streamed(vocoder, codes[:30], speaker, 3, 7)[0], vocoder.vocode(codes[:30], speaker, 3)
    )
    # The seed still picks the noise.
    assert np.abs(streamed(vocoder, codes, speaker, 4, 25)[0] - audio).max() > 1e-2 * peak


def test_token2wav_codes_that_piled_up_decode_in_fewer_windows_to_the_same_audio(parts):
    """A vocoder behind its talker gets many codes at once: after the first chunk it samples every
    ready block in one DiT window (3 windows for 8 s of speech instead of 4), the same audio."""
    vocoder = parts["vocoder"]
    speaker = vocoder.speaker(None)
    codes = np.random.default_rng(5).integers(0, 59, 400).tolist()
    whole = vocoder.vocode(codes, speaker, seed=1)
    with counted(vocoder.vocoder_batcher) as calls:
        piled, first = streamed(vocoder, codes, speaker, 1, per_push=400)
        windows = {"piled": calls.count("dit")}
        calls.clear()
        paced = streamed(vocoder, codes, speaker, 1, per_push=25)[0]
        windows["paced"] = calls.count("dit")
    assert windows == {"piled": 3, "paced": 4}
    peak = np.abs(whole).max()
    np.testing.assert_allclose(piled, whole, atol=1e-5 * peak, rtol=0)
    np.testing.assert_allclose(paced, whole, atol=1e-5 * peak, rtol=0)


@contextlib.contextmanager
def counted(batcher) -> Iterator[list]:
    """The kinds of the calls `batcher` runs meanwhile (a key's first element, or the key)."""
    calls: list = []
    handler = batcher.handler

    def counting(key, items):
        calls.append(key[0] if isinstance(key, tuple) else key)
        return handler(key, items)

    batcher.handler = counting
    try:
        yield calls
    finally:
        batcher.handler = handler


def test_concurrent_token2wav_streams_decode_in_batches(parts):
    """Streams decoded at once share DiT and BigVGAN batches, and each gets the audio it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    vocoder = parts["vocoder"]
    speaker = vocoder.speaker(None)
    rng = np.random.default_rng(1)
    utterances = [
        (rng.integers(0, 59, n).tolist(), seed) for seed, n in enumerate([200, 200, 130, 260, 90, 200])
    ]
    alone = [streamed(vocoder, codes, speaker, seed, 25)[0] for codes, seed in utterances]
    vocoder.vocoder_batcher.peak_batch = 0
    with ThreadPoolExecutor(len(utterances)) as pool:
        together = list(pool.map(lambda u: streamed(vocoder, u[0], speaker, u[1], 25)[0], utterances))
    assert vocoder.vocoder_batcher.peak_batch > 1
    for one, other in zip(alone, together, strict=True):
        assert other.shape == one.shape
        np.testing.assert_allclose(other, one, atol=1e-5 * np.abs(one).max(), rtol=0)


def test_a_dit_window_encodes_its_speaker_once_not_at_every_sampling_step(parts):
    """The speaker encoder's output is the same at each of the sampler's 36 DiT evaluations: a window
    runs it once (the streamed audio still equals the whole decode's: see above)."""
    vocoder = parts["vocoder"]
    speaker = vocoder.speaker(None)
    encoder = vocoder.model.token2wav.code2wav_dit_model.input_embed.spk_encoder
    calls = []
    hook = encoder.register_forward_hook(lambda *_: calls.append(1))
    try:
        window = (torch.arange(48) % 59, torch.randn(96, 80, generator=torch.Generator().manual_seed(0)))
        vocoder._vocoder_batch(("dit", speaker, 48), [window, window])
        assert len(calls) == 1
        vocoder.vocode(list(range(48)), speaker)  # transformers' own sampling: at every evaluation
        assert len(calls) == 1 + 36  # 9 Runge-Kutta steps of 4 evaluations
    finally:
        hook.remove()
    assert vocoder.model.token2wav.code2wav_dit_model.input_embed.spk_encoder is encoder


def test_audio_batches_equal_single_clips(parts, query_wav, cars_jpg):
    import io
    import wave

    with wave.open(io.BytesIO(query_wav)) as clip:  # the first second, as its own WAV
        params, frames = clip.getparams(), clip.readframes(clip.getframerate())
    short = io.BytesIO()
    with wave.open(short, "wb") as out:
        out.setparams(params)
        out.writeframes(frames)
    encoder = parts["audio"]
    batched = encoder.encode("audio", [query_wav, short.getvalue()])
    alone = encoder.encode("audio", [short.getvalue()])[0]
    assert batched[1].meta == alone.meta and batched[0].meta["feature_length"] > alone.meta["feature_length"]
    np.testing.assert_allclose(batched[1].embeddings, alone.embeddings, atol=1e-5)
    with pytest.raises(MediaError, match="has no depth encoder; it encodes image, audio, video"):
        encoder.encode("depth", [cars_jpg])
    with pytest.raises(MediaError, match="not a decodable audio clip"):
        encoder.encode("audio", [b"RIFF nonsense"])


def _serve(executors: InProcessExecutors, task: OmniTask, request: ChatRequest) -> tuple[str, bytes, list]:
    graphs = []

    async def go() -> tuple[str, bytes]:
        with use_dispatcher(LocalDispatcher(executors.callables(CLASSES), on_graph=graphs.append)):
            out = await task(request)
            text = await reply_text(out.text)
            audio = b"".join(await out.audio.collect()) if out.audio is not None else b""
            return text, audio

    return (*asyncio.run(go()), graphs)


def test_omni_task_split_and_monolithic_answer_alike(tiny_omni, cars_jpg, query_wav):
    executors = InProcessExecutors()
    request = ChatRequest.of(
        "Describe.", images=[cars_jpg], audios=[query_wav], audio_out=True, max_tokens=8, seed=3
    )
    split = OmniTask(model=tiny_omni, max_codes=40)
    text, audio, graphs = _serve(executors, split, request)
    whole_text, whole_audio, whole_graphs = _serve(
        executors, OmniTask(model=tiny_omni, max_codes=40, monolith=True), request
    )
    assert text == whole_text and text
    kinds = [n.executor_kind for n in graphs[0].nodes]
    assert kinds == ["mm-encoder", "mm-encoder", "mm-thinker", "mm-talker", "mm-vocoder"]
    assert [n.executor_kind for n in whole_graphs[0].nodes] == ["mm-omni"]
    pcm, whole_pcm = np.frombuffer(audio, "<i2"), np.frombuffer(whole_audio, "<i2")
    assert len(pcm) == len(whole_pcm) > 0 and np.abs(whole_pcm).max() > 1000
    assert np.abs(pcm.astype(int) - whole_pcm).max() <= 2  # float noise, then 16-bit rounding
    # Text only: no talker, no vocoder.
    text_only, audio, graphs = _serve(executors, split, ChatRequest.of("Hello", max_tokens=4))
    assert text_only and audio == b"" and [n.executor_kind for n in graphs[0].nodes] == ["mm-thinker"]


def test_omni_task_takes_a_video_with_its_soundtrack(tiny_omni, cars_jpg):
    """With "video" among its modalities the split Omni sends a clip to the video encoder and, with
    `use_audio_in_video`, the clip's soundtrack to the audio encoder; it answers as the monolith."""
    executors = InProcessExecutors()
    modalities = ("image", "audio", "video")
    request = ChatRequest.of(
        "Describe.",
        images=[cars_jpg],
        videos=[video_with_sound(20)],
        audio_out=True,
        max_tokens=6,
        seed=1,
        use_audio_in_video=True,
    )
    split = OmniTask(model=tiny_omni, max_codes=30, modalities=modalities)
    text, audio, graphs = _serve(executors, split, request)
    whole = OmniTask(model=tiny_omni, max_codes=30, modalities=modalities, monolith=True)
    whole_text, whole_audio, _ = _serve(executors, whole, request)
    assert text == whole_text and text
    encoders = [n.task.modality for n in graphs[0].nodes if n.executor_kind == "mm-encoder"]
    assert encoders == ["image", "video", "audio"]
    pcm, whole_pcm = np.frombuffer(audio, "<i2"), np.frombuffer(whole_audio, "<i2")
    assert len(pcm) == len(whole_pcm) > 0 and np.abs(pcm.astype(int) - whole_pcm).max() <= 2
    # Without the soundtrack the clip goes to the video encoder alone.
    _, _, graphs = _serve(executors, split, request.model_copy(update={"use_audio_in_video": False}))
    assert [n.task.modality for n in graphs[0].nodes if n.executor_kind == "mm-encoder"] == ["image", "video"]
    # An Omni without video refuses it as the request's fault.
    with pytest.raises(InvalidInputError, match="takes image, audio input, not video"):
        _serve(executors, OmniTask(model=tiny_omni, max_codes=30), request)


def test_an_omni_on_vllm_says_it_takes_no_video_yet(tiny_omni):
    with pytest.raises(TaskDefinitionError, match=r"OmniTask\(engine='vllm'\) takes no video yet"):
        OmniTask(model=tiny_omni, engine="vllm", modalities=("image", "audio", "video"))


def test_bad_audio_is_rejected_by_the_encoder(tiny_omni):
    executors = InProcessExecutors()
    # The request's fault, named as on the Ray runtime (the gateway answers 400).
    with pytest.raises(
        InvalidInputError, match=r"call #0 \(EncoderTask\) rejected its input: not a decodable audio clip"
    ):
        _serve(
            executors, OmniTask(model=tiny_omni), ChatRequest.of("hear", audios=[b"RIFF....WAVEfmt broken"])
        )


@pytest.mark.parametrize("monolith", [False, True])
def test_a_voice_the_model_lacks_is_the_requests_fault(tiny_omni, monolith):
    executors = InProcessExecutors()
    task = OmniTask(model=tiny_omni, max_codes=10, monolith=monolith)
    request = ChatRequest.of("Speak.", audio_out=True, max_tokens=3, voice="Nobody")
    with pytest.raises(InvalidInputError, match=r"has no speaker 'Nobody'; it has \['Chelsie'\]"):
        _serve(executors, task, request)
    text, audio, _ = _serve(executors, task, request.model_copy(update={"voice": "Chelsie"}))
    assert text and audio


def test_vllm_thinker_equals_the_transformers_thinker_and_its_talker_conditioning(
    tiny_omni, cars_jpg, small_png, query_wav, vllm_probes
):
    """Text only, an image, audio, both, two images (each its own tensor): see `check_vllm_thinker`."""
    check_vllm_thinker(tiny_omni, omni_cases(cars_jpg, small_png, query_wav), vllm_probes)


def test_vllm_thinker_split_into_prefill_and_decode_equals_the_transformers_thinker(
    tiny_omni, cars_jpg, query_wav, vllm_probes, tmp_path
):
    """Text, an image and audio through TriInfer's P and D: see `check_vllm_thinker_prefill_decode`."""
    cases = [
        ChatRequest.of("Say what prismserve is, and why a serving system splits prefill from decode. " * 2),
        ChatRequest.of("Answer the question about the picture.", images=[cars_jpg], audios=[query_wav]),
    ]
    check_vllm_thinker_prefill_decode(tiny_omni, cases, vllm_probes, tmp_path)


def test_a_released_request_stops_its_thinker_generating(tiny_omni):
    """A barge-in or a client gone releases the request's graph on its replicas: the thinker's
    generation (a background task filling its text and talker streams) stops at its next step. It
    used to generate on to its token limit for nobody (the released streams' readers were stopped,
    not what filled them)."""
    limit = 3000

    async def scenario() -> tuple[str, int, str]:
        task = OmniTask(model=tiny_omni)
        spec = ExecutorSpec(backend="model")
        manager = TaskManager(task.thinker.deployment_key(), task.thinker, spec, 0, pool=InProcessPool())
        replica = await manager.add_replica(Placement(None, 0, 0))
        engine = replica.handle.executor.engine
        generations: list[Any] = []
        submit = engine.submit

        def watched(*args: Any, **kwargs: Any) -> Any:  # the real engine; its generation kept
            generations.append(submit(*args, **kwargs))
            return generations[-1]

        engine.submit = watched
        ledger = RequestLedger()
        try:
            with (
                use_dispatcher(ReplicaDispatcher({manager.key: manager})),
                use_request(RequestContext(ledger=ledger)),
            ):
                output = await task(ChatRequest.of("Tell a long story.", max_tokens=limit))
                first = await anext(aiter(output.text))
            ledger.end()  # the request ends: its graph is released on its replicas
            generated = await asyncio.wait_for(asyncio.wrap_future(generations[0]), 30)
            return first.text, len(generated.token_ids), generated.finish_reason
        finally:
            await manager.close()

    first, tokens, reason = asyncio.run(scenario())
    assert first and tokens < limit / 10, (tokens, reason)
