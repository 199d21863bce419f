"""LLMs on transformers: `HFLLMExecutor` streams text (with the encoders too it is the monolith);
`ThinkerExecutor` also hands an Omni talker its conditioning. Both, and the Omni monolith
(`speech.OmniMonolithExecutor`), run the generation loop of `HFGeneration`.

The transformers backend covers what vLLM cannot run (and the paper's monolithic baseline, 000 §7.1):
concurrent requests are batched by `HFEngine` (continuous batching in a worker thread), tokens handed
to the event loop as they come and turned into text at constant cost per token (`TextDecoder`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from prismserve.executors.base import Executor, call_soon, media_rejected
from prismserve.executors.hf_engine import HFEngine
from prismserve.executors.loading import model_adapter
from prismserve.executors.text import ReplyText
from prismserve.models import Encoded, MediaInput
from prismserve.models.conditioning import ConditioningBuilder
from prismserve.protocol.chat import TextDelta
from prismserve.task import Stream
from prismserve.task.components import LLMInput, LLMSettings, ModelSettings, ThinkerOutput

_END = object()

GenerationSettingsT = TypeVar("GenerationSettingsT", bound=ModelSettings)
GenerationOutputT = TypeVar("GenerationOutputT")


class HFGeneration(Executor[GenerationSettingsT, LLMInput, GenerationOutputT]):
    """An LLM on transformers generating for a conversation with precomputed embeddings or raw media:
    the loop the text LLM, the Omni thinker and the Omni monolith share."""

    max_batch = 32  # rows decoded together; more requests wait for a row to free

    async def load(self) -> None:
        self.adapter = model_adapter(self.task)
        await asyncio.to_thread(self.adapter.load_llm, self.takes_media)
        self.engine = HFEngine(self.adapter, self.max_batch)

    async def close(self) -> None:
        if hasattr(self, "engine"):
            await asyncio.to_thread(self.engine.close)

    @property
    def takes_media(self) -> bool:
        """Whether this deployment holds the encoders (takes raw media)."""
        raise NotImplementedError(f"{type(self).__name__} does not say whether it takes raw media")

    async def inputs(self, task_input: Any) -> tuple[LLMInput, dict[str, Any]]:
        """The request and the model inputs built from it; bad media is an InvalidInputError."""
        request = LLMInput.model_validate(task_input)
        request.check_media(self.takes_media, self.task.model)
        encoded = [Encoded(e.modality, e.embeddings.value, e.meta.value) for e in request.encoded]
        media = [MediaInput(m.modality, m.data) for m in request.media]
        with media_rejected():
            return request, await asyncio.to_thread(
                self.adapter.llm_inputs, request.conversation, encoded, media, request.tools
            )

    async def texts(
        self, request: LLMInput, inputs: dict[str, Any], speech: ConditioningBuilder | None = None
    ) -> AsyncIterator[TextDelta]:
        """Text deltas as they are generated, sampled as `request` says, the last one with the
        finish reason and the prompt's length; `speech` (the talker's conditioning) is fed every
        token and each position's hidden states on the engine's thread as they come."""
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        logprobs: list[Any] = [None]  # the last token's, set on the engine thread just before it

        def on_token(token: int) -> None:
            if speech is not None:
                speech.add_token(token)
            loop.call_soon_threadsafe(tokens.put_nowait, (token, logprobs[0]))

        def on_states(states: Any) -> None:
            assert speech is not None
            speech.add_states(*self.adapter.talker_states(states))

        generation = self.engine.submit(
            inputs,
            request.max_tokens,
            sampling=request,
            on_token=on_token,
            should_stop=stop.is_set,
            on_states=on_states if speech is not None else None,
            on_logprobs=lambda entry: logprobs.__setitem__(0, entry),
        )
        generation.add_done_callback(lambda _: call_soon(loop, tokens.put_nowait, _END))
        reply = ReplyText(self.adapter.tokenizer, self.adapter.eos_token_ids(), request.stop)
        try:
            while (item := await tokens.get()) is not _END:
                if (delta := reply.push(*item)) is not None:
                    yield delta
                if reply.stopped:
                    stop.set()  # a stop string ended the reply: the engine frees its row
                    break
            result = await asyncio.wrap_future(generation)  # raises what generation raised
            yield reply.finish(result.finish_reason, result.prompt_tokens)  # type: ignore[arg-type]
        finally:
            stop.set()  # a consumer that went away frees the engine at the next token


class HFLLMExecutor(HFGeneration[LLMSettings, Stream[TextDelta]]):
    """Streams the text an LLM generates for a conversation with precomputed embeddings or raw media."""

    @property
    def takes_media(self) -> bool:
        """Whether this deployment holds the encoders (takes raw media)."""
        return self.task.with_encoders

    async def stream(self, task_input: Any) -> AsyncIterator[TextDelta]:
        request, inputs = await self.inputs(task_input)
        async for text in self.texts(request, inputs):
            yield text


class ThinkerExecutor(HFGeneration[LLMSettings, ThinkerOutput]):
    """An Omni thinker: streams text and, when speech is asked for, the talker's conditioning while
    it generates (the talker starts on its first tokens)."""

    @property
    def takes_media(self) -> bool:
        """Whether this deployment holds the encoders (takes raw media)."""
        return self.task.with_encoders

    async def run(self, task_input: Any) -> ThinkerOutput:
        request, inputs = await self.inputs(task_input)  # bad input fails the call itself
        loop = asyncio.get_running_loop()
        text: Stream[TextDelta] = Stream("text")
        talker: Stream[Any] = Stream("talker")
        speech = None
        if request.speech:
            with media_rejected():
                speaker = self.adapter.speaker(request.speaker)
            speech = self.adapter.conditioning(
                inputs, speaker, lambda item: call_soon(loop, talker.put, item)
            )

        async def think() -> None:
            try:
                async for delta in self.texts(request, inputs, speech):
                    text.put(delta)
            except Exception as exc:  # noqa: BLE001 - both consumers get the thinker's error
                text.fail(exc)
                talker.fail(exc)
                return
            text.close()
            try:
                if speech is not None:  # its items reach the stream before it closes (one queue)
                    await asyncio.to_thread(speech.finish)
                talker.close()
            except Exception as exc:  # noqa: BLE001 - the talker's consumer gets the error
                talker.fail(exc)

        self.spawn(think())
        return ThinkerOutput(text=text, talker=talker)
