"""Speech executors of Omni models: the talker (thinker states -> codec ids), the vocoder (codec ids
-> audio), and the whole model run by transformers' own `generate` (the monolithic baseline)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from prismserve.executors.base import Executor, call_soon, media_rejected
from prismserve.executors.hf_engine import HFEngine
from prismserve.executors.hf_llm import HFGeneration
from prismserve.executors.loading import model_adapter
from prismserve.executors.text import ReplyText
from prismserve.models.base import context_length
from prismserve.models.conditioning import REPLY, ReplyFeed
from prismserve.protocol.chat import TextDelta
from prismserve.task import InvalidInputError, Stream
from prismserve.task.components import (
    LLMInput,
    ModelSettings,
    OmniMonolithSettings,
    SpeechOutput,
    TalkerInput,
    VocoderInput,
)

CHUNK_SAMPLES = 12000  # half a second at 24 kHz per streamed audio chunk


def pcm16_chunks(wav: np.ndarray) -> list[bytes]:
    """16-bit little-endian mono PCM of float samples in [-1, 1], in chunks of CHUNK_SAMPLES."""
    pcm = (np.clip(wav, -1.0, 1.0) * 32767).astype("<i2")
    return [pcm[i : i + CHUNK_SAMPLES].tobytes() for i in range(0, len(pcm), CHUNK_SAMPLES)]


class TalkerExecutor(Executor[ModelSettings, TalkerInput, Stream[list[Any]]]):
    """Generates codes from the conditioning a thinker streams, streaming them in chunks. A request
    starts on the thinker's first item, the rest of the reply fed as it comes (`ReplyFeed`: the
    request waits for rows yet to come). Concurrent requests decode together in one batch
    (`HFEngine`, fed as the family's `talker_model` says): Qwen2.5-Omni's codec ids, or Qwen3-Omni's
    frames (its code predictor run for the whole batch at every step), each request's the same as
    its talker's `generate` alone on the whole conditioning."""

    chunk_codes = 25  # per chunk: half a second of Qwen2.5-Omni's speech, two seconds of Qwen3-Omni's frames
    max_batch = 32

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_talker)
        self.engine = HFEngine(self.adapter.talker_model(), self.max_batch)

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.close)

    async def stream(self, task_input: Any) -> AsyncIterator[list[int]]:
        request = TalkerInput.model_validate(task_input)
        items = aiter(request.thinker.batches())
        first = await anext(items, None)
        if first is None:
            raise ValueError("the thinker sent no talker conditioning (was speech asked of it?)")
        # The talker starts on the thinker's first item; the rest of the reply follows (`ReplyFeed`).
        prompt = await asyncio.to_thread(self.adapter.talker_prompt, first[0])
        feed = self.adapter.reply_feed(first[0])
        for item in first[1:]:
            feed.append(self.adapter.reply_rows(item[REPLY]))
        loop = asyncio.get_running_loop()
        codes: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        generation = self.engine.submit(
            prompt,
            request.max_codes,
            temperature=request.temperature,
            on_token=lambda code: call_soon(loop, codes.put_nowait, code),
            should_stop=stop.is_set,
            feed=feed,
        )
        talking = asyncio.wrap_future(generation)
        talking.add_done_callback(lambda _: codes.put_nowait(None))  # after every code streamed
        reading = asyncio.ensure_future(self._read_reply(items, feed, stop))
        generated: list[Any] = []  # what the engine streamed: ids (the end token included), or frames
        sent = 0
        try:
            while (code := await codes.get()) is not None:
                generated.append(code)
                spoken = self.adapter.until_end(generated)
                if len(spoken) - sent >= self.chunk_codes:
                    yield spoken[sent:]
                    sent = len(spoken)
            await talking  # raises what the talker raised
            if reading.done():
                reading.result()  # raises what the thinker raised (it stopped the talker)
        finally:
            stop.set()  # a consumer that went away frees the engine's row at the next step
            reading.cancel()
        spoken = self.adapter.until_end(generated)
        if len(spoken) > sent:
            yield spoken[sent:]

    async def _read_reply(
        self, items: AsyncIterator[list[Any]], feed: ReplyFeed, stop: threading.Event
    ) -> None:
        """Hand the talker the reply rows the thinker streams after its first item; a thinker that
        fails stops the talker (its error is raised here)."""
        try:
            async for batch in items:
                feed.append([row for item in batch for row in self.adapter.reply_rows(item[REPLY])])
        except BaseException:
            stop.set()
            raise
        finally:
            feed.close()


class VocoderExecutor(Executor[ModelSettings, VocoderInput, Stream[bytes]]):
    """Turns codes into 24 kHz audio as they arrive, chunk by chunk while the talker is still
    talking (the family's streaming decode, `vocoder_stream`)."""

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_vocoder)

    async def stream(self, task_input: Any) -> AsyncIterator[bytes]:
        request = VocoderInput.model_validate(task_input)
        with media_rejected():
            decoder = self.adapter.vocoder_stream(self.adapter.speaker(request.speaker), request.seed)
        # Chunks that arrived while the last ones decoded go in together: one window, less context.
        async for pieces in request.codes.batches():
            codes = [code for piece in pieces for code in piece]
            for chunk in pcm16_chunks(await asyncio.to_thread(decoder.push, codes)):
                yield chunk
        for chunk in pcm16_chunks(await asyncio.to_thread(decoder.finish)):
            yield chunk


class OmniMonolithExecutor(HFGeneration[OmniMonolithSettings, SpeechOutput]):
    """The whole Omni model in one process, run by transformers' `generate`: text streams as the
    thinker generates it, audio follows once the talker and token2wav are done."""

    @property
    def takes_media(self) -> bool:
        """The monolith holds the encoders: it always takes raw media."""
        return True

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_monolith)

    async def run(self, task_input: Any) -> SpeechOutput:
        request, inputs = await self.inputs(task_input)
        _greedy_only(request)
        with media_rejected():
            speaker = self.adapter.speaker(request.speaker)
        text: Stream[TextDelta] = Stream("text")
        audio: Stream[bytes] = Stream("audio")
        loop = asyncio.get_running_loop()
        reply = ReplyText(self.adapter.tokenizer, self.adapter.eos_token_ids())
        prompt_tokens = inputs["input_ids"].shape[1]
        room = (context_length(self.adapter.model.thinker) or prompt_tokens + 1) - prompt_tokens
        limit = room if request.max_tokens is None else min(request.max_tokens, room)
        if limit < 1:
            raise InvalidInputError(f"the prompt has {prompt_tokens} tokens: it fills the model's context")

        def on_token(token: int) -> None:
            if (delta := reply.push(token)) is not None:
                loop.call_soon_threadsafe(text.put, delta)

        async def speak() -> None:
            try:
                ids, wav = await asyncio.to_thread(self._generate, inputs, request, limit, speaker, on_token)
            except Exception as exc:  # noqa: BLE001 - every consumer gets the model's error
                text.fail(exc)
                audio.fail(exc)
                return
            ended = bool(ids) and ids[-1] in self.adapter.eos_token_ids()
            text.put(reply.finish("stop" if ended or len(ids) < limit else "length", prompt_tokens))
            text.close()
            for chunk in pcm16_chunks(wav) if wav is not None else []:
                audio.put(chunk)
            audio.close()

        self.spawn(speak())
        return SpeechOutput(text=text, audio=audio)

    def _generate(
        self,
        inputs: dict[str, Any],
        request: Any,
        limit: int,
        speaker: str,
        on_token: Callable[[int], None],
    ) -> Any:
        return self.adapter.generate_all(
            inputs,
            limit,
            self.task.max_codes,
            speaker,
            seed=request.seed or 0,
            audio=request.speech,
            on_token=on_token,
        )


def _greedy_only(request: LLMInput) -> None:
    """The monolith is transformers' own end-to-end `generate`, greedy: a request asking for any other
    sampling is refused, naming the field (never served as if it had not asked)."""
    asked = {
        "temperature": bool(request.temperature),
        "top_p": request.top_p not in (None, 1.0),
        "top_k": request.top_k not in (None, 0, -1),
        "min_p": bool(request.min_p),
        "repetition_penalty": request.repetition_penalty not in (None, 1.0),
        "presence_penalty": bool(request.presence_penalty),
        "frequency_penalty": bool(request.frequency_penalty),
        "stop": bool(request.stop),
        "logprobs": request.top_logprobs is not None,
    }
    for name, refused in asked.items():
        if refused:
            raise InvalidInputError(
                f"{name}: the Omni monolith (transformers' end-to-end generate) decodes greedily and "
                "cannot honour it; serve the split model (OmniTask(monolith=False)) for sampling"
            )
