"""LLMs on vLLM's async engine (`VLLMTask`): continuous batching, text streamed per token.

The replica runs in the vLLM environment (`prismserve.executors.envs`), with its own transformers:
of the family adapter it uses only the forms vLLM takes (`Adapter.vllm_embeddings`), no weights.

Media arrives as embeddings an encoder deployment computed (fissioned; in the form the family's
vLLM class takes: Qwen's `{modality}_embeds` plus the encoder's metadata such as `image_grid_thw`,
or one `[tokens, hidden]` tensor per item for InternVL3 and Gemma 3) or raw (the monolith: vLLM
runs the model's own encoders). The prompt is the conversation through the checkpoint's chat
template; vLLM expands each media placeholder to the item's tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from prismserve.executors.base import Executor, ExecutorUnhealthy, media_rejected
from prismserve.executors.text import TextDecoder
from prismserve.models import Encoded, adapter_for
from prismserve.task import InvalidInputError
from prismserve.tasklib.units import LLMInput, VLLMTask, VLLMThinkerTask

AUDIO_RATE = 16_000  # what the audio encoders of the supported families take; vLLM resamples otherwise


def engine_settings(task: VLLMTask | VLLMThinkerTask, *, cuda: bool) -> dict[str, Any]:
    """vLLM's engine arguments for `task`, on a CUDA device or not (its `engine_args` override them).

    On CUDA the task's GPUs shape the engine: whole GPUs are its tensor parallelism (vLLM's own
    multiprocessing workers, inside the replica Ray gave that many GPUs), a share of one GPU is the part of
    that GPU's memory vLLM may take (the replicas sharing it take the rest). On the CPU (declared
    GPUs) neither applies: the KV cache is `kv_cache_gib` and one process runs the model.
    """
    settings: dict[str, Any] = {
        "model": task.model,
        "dtype": task.dtype,
        "max_model_len": task.max_model_len,
        "enable_mm_embeds": not task.with_encoders,
        "enforce_eager": not cuda,
    }
    if cuda and task.gpus >= 1:
        settings["tensor_parallel_size"] = int(task.gpus)
        if task.gpus > 1:
            # vLLM picks its Ray executor inside a placement group, whose workers would wait for GPUs
            # this replica already holds; its own worker processes see the replica's GPUs instead.
            settings["distributed_executor_backend"] = "mp"
    elif cuda and task.gpus > 0:
        settings["gpu_memory_utilization"] = task.gpus
    return settings


class VLLMExecutor(Executor):
    """Streams the text vLLM generates for a conversation with precomputed embeddings or raw media."""

    task: VLLMTask | VLLMThinkerTask  # the Omni thinker reuses prompt and generation
    _ids = itertools.count()

    async def load(self) -> None:
        os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.task.kv_cache_gib))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = await asyncio.to_thread(
            AsyncLLM.from_engine_args, AsyncEngineArgs(**self.engine_arguments())
        )
        self.tokenizer = self.engine.get_tokenizer()
        self.end_ids = await asyncio.to_thread(self._end_ids)
        self.adapter = adapter_for(self.task.model)  # the family's forms; it loads no weights

    def _end_ids(self) -> set[int]:
        """The ids vLLM ends generation on: the tokenizer's end token and the generation config's."""
        from transformers import GenerationConfig

        ids = {self.tokenizer.eos_token_id}
        try:
            configured = GenerationConfig.from_pretrained(self.task.model).eos_token_id
        except OSError:  # no generation_config.json
            configured = None
        ids.update(configured if isinstance(configured, list) else [configured])
        return {int(i) for i in ids if i is not None}

    def decoder(self) -> TextDecoder:
        """A request's incremental detokenizer: prismserve's, as on transformers (vLLM's would drop
        an incomplete character at the end where transformers' engines give U+FFFD)."""
        return TextDecoder(self.tokenizer, self.end_ids)

    def engine_arguments(self) -> dict[str, Any]:
        """What the engine is built with: `engine_settings`, overridden by the task's `engine_args`."""
        return {**self.engine_settings(), **self.task.engine_args}

    def engine_settings(self) -> dict[str, Any]:
        """vLLM's engine arguments for the task (the task's `engine_args` override them)."""
        import torch

        return engine_settings(self.task, cuda=torch.cuda.is_available())

    async def health(self) -> None:
        if self.engine.errored:
            raise ExecutorUnhealthy(f"vLLM engine of {self.task.model} died: {self.engine.dead_error}")

    def prompt(self, request: LLMInput) -> dict[str, Any]:
        """vLLM's prompt for `request`: chat-template text and the media, as embeddings or raw."""
        self.check_media(request)
        if any(e.modality == "video" for e in request.encoded) or any(
            m.modality == "video" for m in request.media
        ):
            raise InvalidInputError(
                "vLLM executors take no video yet: serve video with the transformers engine"
            )
        text = self.tokenizer.apply_chat_template(
            request.conversation, tokenize=False, add_generation_prompt=True
        )
        data: dict[str, Any] = {}
        encoded = [Encoded(e.modality, np.asarray(e.embeddings.value), e.meta.value) for e in request.encoded]
        for modality in dict.fromkeys(e.modality for e in encoded):
            # The form vLLM's model class takes is the family's.
            data[modality] = self.adapter.vllm_embeddings([e for e in encoded if e.modality == modality])
        for modality in dict.fromkeys(m.modality for m in request.media):
            data[modality] = [_decode(m.modality, m.data) for m in request.media if m.modality == modality]
        return {"prompt": text, "multi_modal_data": data} if data else {"prompt": text}

    def check_media(self, request: LLMInput) -> None:
        """Refuse raw media this deployment cannot take (InvalidInputError)."""
        request.check_media(self.task.with_encoders, self.task.model)

    async def generate(self, request: LLMInput, logprobs: bool = False) -> AsyncIterator[Any]:
        """vLLM's output deltas for `request` (each with new token ids, and logprobs if asked)."""
        async for out in self.outputs(request, logprobs=logprobs):
            yield out.outputs[0]

    async def outputs(
        self,
        request: LLMInput,
        *,
        prompt: dict[str, Any] | None = None,
        logprobs: bool = False,
        extra_args: dict[str, Any] | None = None,
    ) -> AsyncIterator[Any]:
        """vLLM's `RequestOutput` deltas for `request` (its `prompt` when already built); `extra_args`
        go to the sampling parameters (a KV connector's `kv_transfer_params`)."""
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineGenerateError

        if prompt is None:
            with media_rejected():
                prompt = self.prompt(request)
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            seed=request.seed,
            logprobs=-1 if logprobs else None,
            detokenize=False,  # text comes from `decoder()`
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args,
        )
        request_id = f"{os.getpid()}-{next(self._ids)}"
        started = False
        try:
            async for out in self.engine.generate(prompt, params, request_id):
                started = True
                yield out
        except (VLLMClientError, EngineGenerateError) as exc:
            # vLLM rejects what it cannot process (a prompt too long, media its processor cannot
            # take) before the first output; later failures are the engine's.
            cause = exc if isinstance(exc, VLLMClientError) else exc.__cause__
            if started or not isinstance(cause, (ValueError, TypeError)):
                raise
            raise InvalidInputError(f"{self.task.model} cannot take this input: {cause}") from exc

    async def stream(self, task_input: Any) -> AsyncIterator[str]:
        decoder = self.decoder()
        async for delta in self.generate(LLMInput.model_validate(task_input)):
            if text := "".join(decoder.push(token) for token in delta.token_ids):
                yield text
        if tail := decoder.flush():
            yield tail

    async def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()  # AsyncLLM.__del__ does not stop the engine's processes reliably


def _decode(modality: str, data: bytes) -> Any:
    """Raw media as vLLM takes it: a PIL image, or (samples, rate) for audio."""
    from prismserve.models.media import load_audio, load_image

    return load_image(data) if modality == "image" else (load_audio(data, AUDIO_RATE), AUDIO_RATE)
