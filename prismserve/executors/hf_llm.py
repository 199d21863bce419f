"""LLMs on transformers: `HFLLMExecutor` streams text (with the encoders too it is the monolith);
`ThinkerExecutor` also hands an Omni talker its conditioning.

The transformers backend covers what vLLM cannot run (and the paper's monolithic baseline, 000 §7.1):
concurrent requests are batched by `HFEngine` (continuous batching in a worker thread), tokens handed
to the event loop as they come and turned into text at constant cost per token (`TextDecoder`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from prismserve.executors.base import Executor, call_soon, media_rejected
from prismserve.executors.hf_engine import HFEngine
from prismserve.executors.loading import model_adapter
from prismserve.executors.text import TextDecoder
from prismserve.models import Encoded, Generated, MediaInput
from prismserve.task import Stream
from prismserve.tasklib.units import LLMInput, LLMTask, OmniMonolithTask, ThinkerOutput, ThinkerTask

_END = object()


class HFLLMExecutor(Executor):
    """Streams the text an LLM generates for a conversation with precomputed embeddings or raw media."""

    task: LLMTask | ThinkerTask | OmniMonolithTask  # the Omni monolith reuses the generation loop
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
        """Whether this deployment holds the encoders (takes raw media); the Omni monolith always does."""
        return isinstance(self.task, OmniMonolithTask) or self.task.with_encoders

    async def inputs(self, task_input: Any) -> tuple[LLMInput, dict[str, Any]]:
        """The request and the model inputs built from it; bad media is an InvalidInputError."""
        request = LLMInput.model_validate(task_input)
        request.check_media(self.takes_media, self.task.model)
        encoded = [Encoded(e.modality, e.embeddings.value, e.meta.value) for e in request.encoded]
        media = [MediaInput(m.modality, m.data) for m in request.media]
        with media_rejected():
            return request, await asyncio.to_thread(
                self.adapter.llm_inputs, request.conversation, encoded, media
            )

    async def texts(
        self, request: LLMInput, inputs: dict[str, Any], result: list[Generated]
    ) -> AsyncIterator[str]:
        """Text deltas as they are generated; the whole generation is appended to `result` at the end."""
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        generation = self.engine.submit(
            inputs,
            request.max_tokens,
            temperature=request.temperature,
            seed=request.seed,
            on_token=lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t),
            should_stop=stop.is_set,
            with_hidden=request.speech,
        )
        generation.add_done_callback(lambda _: call_soon(loop, tokens.put_nowait, _END))
        decoder = TextDecoder(self.adapter.tokenizer, self.adapter.eos_token_ids())
        try:
            while (token := await tokens.get()) is not _END:
                if text := decoder.push(token):
                    yield text
            result.append(await asyncio.wrap_future(generation))  # raises what generation raised
            if text := decoder.flush():
                yield text
        finally:
            stop.set()  # a consumer that went away frees the engine at the next token

    async def stream(self, task_input: Any) -> AsyncIterator[str]:
        request, inputs = await self.inputs(task_input)
        async for text in self.texts(request, inputs, []):
            yield text


class ThinkerExecutor(HFLLMExecutor):
    """An Omni thinker: streams text, then (when speech is asked for) the talker's conditioning."""

    task: ThinkerTask

    async def run(self, task_input: Any) -> ThinkerOutput:
        request, inputs = await self.inputs(task_input)  # bad input fails the call itself
        if request.speech:
            with media_rejected():
                speaker = self.adapter.speaker(request.speaker)
        text: Stream[str] = Stream("text")
        talker: Stream[Any] = Stream("talker")

        async def think() -> None:
            result: list[Generated] = []
            try:
                async for delta in self.texts(request, inputs, result):
                    text.put(delta)
            except Exception as exc:  # noqa: BLE001 - both consumers get the thinker's error
                text.fail(exc)
                talker.fail(exc)
                return
            text.close()
            try:
                if request.speech:
                    talker.put(
                        await asyncio.to_thread(self.adapter.talker_inputs, inputs, result[0], speaker)
                    )
                talker.close()
            except Exception as exc:  # noqa: BLE001 - the talker's consumer gets the error
                talker.fail(exc)

        self.spawn(think())
        return ThinkerOutput(text=text, talker=talker)
