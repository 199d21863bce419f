"""Qwen3-Omni's thinker split from its image (DeepStack) and audio encoders computes the monolith's logits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from media_clips import video_with_sound
from vllm_jobs import check_vllm_thinker, check_vllm_thinker_prefill_decode, omni_cases

from prismserve.executors.loading import InProcessExecutors
from prismserve.models import MediaInput, adapter_for
from prismserve.models.qwen2_5_omni import Slot
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher
from prismserve.tasklib import EncoderTask, LLMTask, MLLMTask, conversation, reply_text

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def tiny_qwen3() -> str:
    from prismserve.models import tiny

    return str(tiny.build("qwen3-omni"))


def test_fissioned_thinker_logits_equal_the_monoliths(tiny_qwen3, cars_jpg, query_wav):
    adapters = {name: adapter_for(tiny_qwen3) for name in ("image", "audio", "thinker", "monolith")}
    adapters["image"].load_encoder("image")
    adapters["audio"].load_encoder("audio")
    adapters["thinker"].load_llm(with_encoders=False)
    adapters["monolith"].load_llm(with_encoders=True)
    messages, media = conversation(ChatRequest.of("Answer.", images=[cars_jpg], audios=[query_wav]))
    encoded = [adapters[m.modality].encode(m.modality, [m.data])[0] for m in media]
    image = encoded[0].embeddings
    assert image.shape[0] == 3  # the embeddings and two DeepStack levels
    thinker, monolith = adapters["thinker"], adapters["monolith"]
    fissioned = thinker.generate(thinker.llm_inputs(messages, encoded=encoded), 10, with_logits=True)
    raw = monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    whole = monolith.generate(raw, 10, with_logits=True)
    assert fissioned.token_ids == whole.token_ids
    np.testing.assert_allclose(fissioned.logits, whole.logits, atol=1e-4, rtol=0)
    # The DeepStack rows reach the thinker: without them, other logits.
    encoded[0].embeddings = np.concatenate([image[:1], np.zeros_like(image[1:])])
    flat = thinker.generate(thinker.llm_inputs(messages, encoded=encoded), 1, with_logits=True)
    assert np.abs(flat.logits[0] - whole.logits[0]).max() > 1e-4


def test_mllm_task_serves_qwen3_omni_text(tiny_qwen3, cars_jpg, query_wav):
    request = ChatRequest.of("Answer.", images=[cars_jpg], audios=[query_wav], max_tokens=6)

    async def text(fission: bool) -> str:
        with use_dispatcher(LocalDispatcher(InProcessExecutors().callables({EncoderTask, LLMTask}))):
            task = MLLMTask(model=tiny_qwen3, modalities=("image", "audio"), encoder_fission=fission)
            return await reply_text((await task(request)).text)

    split, whole = asyncio.run(text(True)), asyncio.run(text(False))
    # Equal, and not because both are empty: 6 tokens make at least two words and 6 characters.
    assert split == whole and len(whole.split()) >= 2 and len(whole) >= 6, (split, whole)


def test_split_speech_equals_transformers_generate(tiny_qwen3, cars_jpg, query_wav):
    """Encoders -> thinker -> talker (+ code predictor) -> code2wav, each alone, against transformers'
    end-to-end `generate`: the same text, codec frames and audio."""
    adapters = {
        name: adapter_for(tiny_qwen3)
        for name in ("image", "audio", "thinker", "talker", "vocoder", "monolith")
    }
    adapters["image"].load_encoder("image")
    adapters["audio"].load_encoder("audio")
    adapters["thinker"].load_llm(with_encoders=False)
    adapters["talker"].load_talker()
    adapters["vocoder"].load_vocoder()
    adapters["monolith"].load_monolith()
    messages, media = conversation(ChatRequest.of("Answer aloud.", images=[cars_jpg], audios=[query_wav]))
    monolith = adapters["monolith"]
    speaker = monolith.speaker(None)
    raw = monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    whole_tokens, whole_wav = monolith.generate_all(raw, 10, 40, speaker)

    encoded = [adapters[m.modality].encode(m.modality, [m.data])[0] for m in media]
    thinker = adapters["thinker"]
    inputs = thinker.llm_inputs(messages, encoded=encoded)
    thought = thinker.generate(inputs, 10, with_hidden=True)
    assert thought.token_ids == whole_tokens
    streamed = []
    frames = adapters["talker"].talk(
        thinker.talker_inputs(inputs, thought, speaker), 40, on_code=streamed.append
    )
    assert frames and streamed == frames and {len(f) for f in frames} == {4}  # one id per codebook
    wav = adapters["vocoder"].vocode(frames, speaker)
    peak = np.abs(whole_wav).max()
    assert peak > 0.05  # audible: the comparison below is not between silences
    assert wav.shape == whole_wav.shape
    np.testing.assert_allclose(wav, whole_wav, atol=1e-4 * peak, rtol=0)
    # The residual codebooks reach code2wav: dropping them changes the audio.
    flat = adapters["vocoder"].vocode([[f[0], 0, 0, 0] for f in frames], speaker)
    assert np.abs(flat - wav).max() > 1e-2 * peak


def test_a_video_with_its_soundtrack_split_equals_transformers_generate(tiny_qwen3, cars_jpg, query_wav):
    """An image, a spoken question and a 3 s clip whose soundtrack goes in too (`use_audio_in_video`):
    split (the clip's embeddings with their DeepStack levels, its soundtrack through the audio
    encoder, the two merged by time in the thinker's prompt), the thinker's logits and the speech
    are transformers' `generate`'s on the raw media; the soundtrack changes the logits."""
    from test_qwen2_5_omni import loaded_parts

    adapters = loaded_parts(tiny_qwen3)
    request = ChatRequest.of(
        "Answer aloud.",
        images=[cars_jpg],
        audios=[query_wav],
        videos=[video_with_sound(30)],
        use_audio_in_video=True,
    )
    messages, media = conversation(request)
    monolith = adapters["monolith"]
    speaker = monolith.speaker(None)
    raw = monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    whole_tokens, whole_wav = monolith.generate_all(raw, 8, 40, speaker)
    whole_logits = monolith.generate(raw, 8, with_logits=True).logits

    encoded = [adapters[m.modality].encode(m.modality, [m.data])[0] for m in media]
    assert encoded[2].embeddings.shape[0] == 3  # the clip's embeddings and two DeepStack levels
    thinker = adapters["thinker"]
    inputs = thinker.llm_inputs(messages, encoded=encoded)
    assert inputs["use_audio_in_video"] is True and (inputs["input_ids"] == raw["input_ids"]).all()
    thought = thinker.generate(inputs, 8, with_logits=True, with_hidden=True)
    assert thought.token_ids == whole_tokens
    np.testing.assert_allclose(thought.logits, whole_logits, atol=1e-4, rtol=0)
    frames = adapters["talker"].talk(thinker.talker_inputs(inputs, thought, speaker), 40)
    wav = adapters["vocoder"].vocode(frames, speaker)
    peak = np.abs(whole_wav).max()
    assert peak > 0.05 and wav.shape == whole_wav.shape
    np.testing.assert_allclose(wav, whole_wav, atol=1e-4 * peak, rtol=0)
    silent = conversation(request.model_copy(update={"use_audio_in_video": False}))[0]
    alone = thinker.generate(thinker.llm_inputs(silent, encoded=encoded[:3]), 1, with_logits=True)
    assert np.abs(alone.logits[0] - thought.logits[0]).max() > 1e-4


@pytest.mark.parametrize(("frames", "seconds", "audio_tokens"), [(2, 1.0, 13), (6, 1.0, 39), (4, 0.5, 30)])
def test_the_soundtrack_is_merged_by_time_as_the_models_processor_does_it(
    tiny_qwen3, frames, seconds, audio_tokens
):
    """Qwen3-Omni's processor places each video token at its time among the audio tokens
    (`replace_video_with_audio_token`): the thinker's layout is that one (its video processor, which
    needs torchvision, only lends its merge size: the image processor's)."""
    thinker = adapter_for(tiny_qwen3)
    processor = thinker.processor
    grid = [frames, 8, 12]
    video = {"video_grid_thw": torch.tensor([grid]), "video_second_per_grid": [seconds]}
    processor.video_processor = processor.image_processor
    expected = processor.replace_video_with_audio_token(
        video, 0, {"num_audio_tokens": [audio_tokens]}, 0, position_id_per_seconds=13.0
    )
    placeholder = thinker.soundtrack_placeholder(Slot("video", frames * 24, grid, seconds), audio_tokens)
    assert placeholder == expected and placeholder.count(processor.audio_token) == audio_tokens


def test_streaming_code2wav_decodes_as_the_whole_utterance(tiny_qwen3):
    """Code2wav in chunks of 25 frames with 25 of left context, the unfinished tail of each decode
    held for the next: the whole utterance's audio within left-context error, of its length."""
    from concurrent.futures import ThreadPoolExecutor

    from test_qwen2_5_omni import counted, streamed

    vocoder = adapter_for(tiny_qwen3)
    vocoder.load_vocoder()
    speaker = vocoder.speaker(None)
    size = vocoder.model.config.code2wav_config.codebook_size
    frames = np.random.default_rng(0).integers(0, size, (330, 4)).tolist()  # across a reference chunk
    whole = vocoder.vocode(frames, speaker)
    audio, first = streamed(vocoder, frames, speaker, 0, per_push=25)
    assert first == 25  # the first chunk's frames are enough
    peak = np.abs(whole).max()
    assert audio.shape == whole.shape and peak > 0.05
    np.testing.assert_allclose(audio, whole, atol=1e-2 * peak, rtol=0)
    np.testing.assert_array_equal(
        streamed(vocoder, frames[:20], speaker, 0, 7)[0], vocoder.vocode(frames[:20], speaker)
    )
    # Frames that piled up (pushes of 100: a vocoder behind its talker) decode in fewer calls, up to
    # the reference chunk boundary, to the same audio.
    with counted(vocoder.vocoder_batcher) as calls:
        piled = streamed(vocoder, frames, speaker, 0, per_push=100)[0]
        assert len(calls) == 6  # 25 | 25-100 | 100-200 | 200-300 | 300-325 | 325-330
        calls.clear()
        streamed(vocoder, frames, speaker, 0, per_push=25)
        assert len(calls) == 14
    np.testing.assert_allclose(piled, whole, atol=1e-2 * peak, rtol=0)
    # Streams decoded at once share batches, each with the audio it gets alone.
    starts = [0, 0, 5, 10]
    alone = [streamed(vocoder, frames[n:], speaker, 0, 25)[0] for n in starts]
    vocoder.vocoder_batcher.peak_batch = 0
    with ThreadPoolExecutor(len(starts)) as pool:
        together = list(pool.map(lambda n: streamed(vocoder, frames[n:], speaker, 0, 25)[0], starts))
    assert vocoder.vocoder_batcher.peak_batch > 1
    for one, other in zip(alone, together, strict=True):
        np.testing.assert_allclose(other, one, atol=1e-5 * peak, rtol=0)


def test_vllm_thinker_equals_the_transformers_thinker_and_its_talker_conditioning(
    tiny_qwen3, cars_jpg, small_png, query_wav, vllm_probes
):
    """Text only, an image (with its DeepStack levels), audio, both, two images: see `check_vllm_thinker`."""
    check_vllm_thinker(tiny_qwen3, omni_cases(cars_jpg, small_png, query_wav), vllm_probes)


def test_vllm_thinker_split_into_prefill_and_decode_equals_the_transformers_thinker(
    tiny_qwen3, cars_jpg, query_wav, vllm_probes, tmp_path
):
    """Text, and an image with audio, through TriInfer's P and D (the layer the talker listens to
    handed over with the KV): see `check_vllm_thinker_prefill_decode`."""
    cases = [
        ChatRequest.of("Say what prismserve is, and why a serving system splits prefill from decode. " * 2),
        ChatRequest.of("Answer the question about the picture.", images=[cars_jpg], audios=[query_wav]),
    ]
    check_vllm_thinker_prefill_decode(tiny_qwen3, cases, vllm_probes, tmp_path)
