"""LLMs on vLLM's async engine (`VLLMTask`): continuous batching, text streamed per token
(`VLLMExecutor`); prompt and generation are `VLLMGeneration`'s, which the Omni thinker shares.

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
from typing import Any, TypeVar

import numpy as np

from prismserve.executors.base import Executor, ExecutorUnhealthy, deadline_priority, media_rejected
from prismserve.executors.handoff import HANDOFF_FOLDER, mark_taken, sweep_handoffs
from prismserve.executors.text import ReplyText
from prismserve.executors.vllm_plugin import EXTENSIONS  # out-of-tree pieces vLLM loads by name
from prismserve.models import Encoded, adapter_for
from prismserve.protocol.chat import FinishReason, TextDelta
from prismserve.task import ContextLengthError, InvalidInputError, Stream
from prismserve.task.components import (
    DecodeInput,
    Handoff,
    LLMInput,
    VLLMEngineSettings,
    VLLMHandoffSettings,
    checkpoint_dtype,
)

GenerationOutputT = TypeVar("GenerationOutputT")

AUDIO_RATE = 16_000  # what the audio encoders of the supported families take; vLLM resamples otherwise
# CPU attention takes blocks of a multiple of 32 tokens (its default is 128): the KV cache is handed
# over in whole blocks, so smaller ones leave less of a prompt for decode to compute again.
CPU_HANDOFF_BLOCK = 32


def engine_settings(task: VLLMEngineSettings, *, cuda: bool) -> dict[str, Any]:
    """vLLM's engine arguments for `task`, on a CUDA device or not (its `engine_args` override them).

    On CUDA the task's GPUs shape the engine: whole GPUs are its tensor parallelism (vLLM's own
    multiprocessing workers, inside the replica Ray gave that many GPUs), a share of one GPU is the part of
    that GPU's memory vLLM may take (the replicas sharing it take the rest). On the CPU (declared
    GPUs) neither applies: the KV cache is `kv_cache_gib` and one process runs the model.
    """
    settings: dict[str, Any] = {
        "model": task.model,
        "dtype": checkpoint_dtype(task.model) if task.dtype == "auto" else task.dtype,
        "max_model_len": task.max_model_len,
        "enable_mm_embeds": not task.with_encoders,
        "enforce_eager": not cuda,
        # A conversation's next turn repeats the earlier ones: their KV cache is found, not
        # recomputed (vLLM's default for generative models, stated so that it stays on).
        "enable_prefix_caching": True,
        # JSON replies (`json_schema`) under llguidance, as the transformers engine: JSON's optional
        # whitespace left out, or an untrained model may emit whitespace until `max_tokens`.
        "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True},
    }
    if cuda and task.gpus >= 1:
        settings["tensor_parallel_size"] = int(task.gpus)
        if task.gpus > 1:
            # vLLM picks its Ray executor inside a placement group, whose workers would wait for GPUs
            # this replica already holds; its own worker processes see the replica's GPUs instead.
            settings["distributed_executor_backend"] = "mp"
    elif cuda and task.gpus > 0:
        settings["gpu_memory_utilization"] = task.gpus
    if task.quantization is not None:
        settings["quantization"] = task.quantization
    return {**settings, **budget_settings(task)}


# vLLM's default of sequences per step: a token budget below it would be refused, so it lowers them.
VLLM_MAX_NUM_SEQS = 128


def budget_settings(task: VLLMEngineSettings) -> dict[str, Any]:
    """vLLM's scheduler arguments for the task's token budget (none without one): tokens per step,
    prompts chunked to fit them, and no more sequences per step than tokens (vLLM requires it).
    vLLM 0.32's encoder budget follows `max_num_batched_tokens`; it has no setting of its own."""
    if task.token_budget is None:
        return {}
    return {
        "max_num_batched_tokens": task.token_budget,
        "enable_chunked_prefill": True,
        "max_num_seqs": min(task.token_budget, VLLM_MAX_NUM_SEQS),
    }


def handoff_settings(task: VLLMEngineSettings, role: str, *, cuda: bool) -> dict[str, Any]:
    """vLLM's engine arguments for one side (`kv_producer`: prefill, `kv_consumer`: decode) of a
    prefill → decode hand-off through `HandoffConnector` (files in the task's `handoff_dir`)."""
    if not isinstance(task, VLLMHandoffSettings):
        raise TypeError(f"a prefill or decode executor needs VLLMHandoffSettings, not {type(task).__name__}")
    settings: dict[str, Any] = {
        "kv_transfer_config": {
            "kv_connector": "HandoffConnector",
            "kv_connector_module_path": EXTENSIONS,
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": task.handoff_dir},
            "kv_load_failure_policy": "recompute",  # a hand-off that cannot be read is computed
        }
    }
    if not cuda:
        settings["block_size"] = CPU_HANDOFF_BLOCK
    return settings


class VLLMGeneration(Executor[VLLMEngineSettings, LLMInput, GenerationOutputT]):
    """vLLM generating for a conversation with precomputed embeddings or raw media: the engine, the
    prompt and the generation the text LLM and the Omni thinker share."""

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
        self.end_ids, self.defaults = await asyncio.to_thread(self._generation_config)
        self.adapter = adapter_for(self.task.model)  # the family's forms; it loads no weights

    def _generation_config(self) -> tuple[set[int], dict[str, Any]]:
        """From the checkpoint's generation config: the ids vLLM ends generation on (the tokenizer's
        end token and the config's), and the sampling a request gets for what it leaves unset."""
        from transformers import GenerationConfig

        try:
            config = GenerationConfig.from_pretrained(self.task.model)
        except OSError:  # no generation_config.json
            config = GenerationConfig()
        ids = {self.tokenizer.eos_token_id}
        ids.update(config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id])
        return {int(i) for i in ids if i is not None}, checkpoint_sampling(config)

    def reply(self, request: LLMInput) -> ReplyText:
        """A request's incremental detokenizer and stop-string check: prismserve's, as on
        transformers (vLLM's would drop an incomplete character at the end where transformers'
        engines give U+FFFD)."""
        return ReplyText(self.tokenizer, self.end_ids, request.stop)

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

    async def prompt(self, request: LLMInput) -> dict[str, Any]:
        """vLLM's prompt for `request`: chat-template text and the media, as embeddings or raw.

        Raw media is decoded in a worker thread, as vLLM's own server does: a photo's decoding takes
        tens of milliseconds, and on the event loop every other request of this replica would wait
        them out (a text request's first token behind each image that arrived before it). Media it
        cannot take is the request's fault (InvalidInputError)."""
        with media_rejected():
            return await self._prompt(request)

    async def _prompt(self, request: LLMInput) -> dict[str, Any]:
        self.check_media(request)
        if any(e.modality == "video" for e in request.encoded) or any(
            m.modality == "video" for m in request.media
        ):
            raise InvalidInputError(
                "vLLM executors take no video yet: serve video with the transformers engine"
            )
        text = self.tokenizer.apply_chat_template(
            request.conversation, tools=request.tools or None, tokenize=False, add_generation_prompt=True
        )
        data: dict[str, Any] = {}
        encoded = [Encoded(e.modality, np.asarray(e.embeddings.value), e.meta.value) for e in request.encoded]
        for modality in dict.fromkeys(e.modality for e in encoded):
            # The form vLLM's model class takes is the family's.
            data[modality] = self.adapter.vllm_embeddings([e for e in encoded if e.modality == modality])
        if request.media:
            data |= await asyncio.to_thread(_decoded, request.media)
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
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineGenerateError

        if prompt is None:
            prompt = await self.prompt(request)
        params = self.sampling_params(request, logprobs=logprobs, extra_args=extra_args)
        request_id = f"{os.getpid()}-{next(self._ids)}"
        started = False
        try:
            rendered = await self.render(prompt)
            # vLLM orders by it under its `priority` policy (an engine arg), and ignores it under `fcfs`.
            async for out in self.engine.generate(rendered, params, request_id, priority=deadline_priority()):
                started = True
                yield out
        except (VLLMClientError, EngineGenerateError, ValueError, TypeError) as exc:
            # vLLM rejects what it cannot process (a prompt too long: its own VLLMValidationError;
            # media its processor cannot take: a ValueError), in rendering or before the first
            # output; later failures are the engine's.
            cause = exc.__cause__ if isinstance(exc, EngineGenerateError) else exc
            if started or not isinstance(cause, (VLLMClientError, ValueError, TypeError)):
                raise
            # vLLM words a prompt too long as "maximum model length" or "maximum context length",
            # by where it counted the tokens.
            too_long = any(f"maximum {what} length" in str(cause) for what in ("model", "context"))
            refused = ContextLengthError if too_long else InvalidInputError
            raise refused(f"{self.task.model} cannot take this input: {cause}") from exc

    async def render(self, prompt: dict[str, Any]) -> Any:
        """vLLM's engine input for `prompt`, rendered as vLLM's own server renders it: the text
        tokenized on the renderer's pool, media through the processor on a thread of its own. A raw
        prompt handed to `generate` instead goes through one thread that processes every request in
        turn (vLLM's `renderer_num_workers`, 1), so a text request would wait out the processing of
        every photo queued before it (measured on the tiny Qwen2.5-VL: 28 ms behind four photos)."""
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        renderer = self.engine.renderer
        parsed = parse_model_prompt(self.engine.model_config, prompt)
        (rendered,) = await renderer.render_cmpl_async([parsed], renderer.default_cmpl_tok_params)
        return rendered

    def sampling_params(
        self, request: LLMInput, *, logprobs: bool = False, extra_args: dict[str, Any] | None = None
    ) -> Any:
        """vLLM's sampling parameters for `request`: what it sets, the checkpoint's generation config
        for what it leaves unset; `logprobs` asks for the whole vocabulary's (tests)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        chosen = {name: getattr(request, name) for name in _DEFAULTED if getattr(request, name) is not None}
        if request.json_schema is not None:
            chosen["structured_outputs"] = StructuredOutputsParams(json=request.json_schema)
        return SamplingParams(
            **{**self.defaults, **chosen},
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            seed=request.seed,
            logprobs=-1 if logprobs else request.top_logprobs,
            detokenize=False,  # text (and stop strings) come from `reply()`
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args,
        )

    def max_tokens(self, request: LLMInput) -> int | None:
        """The most tokens the reply may have: the request's, else the checkpoint's (None: vLLM's)."""
        return request.max_tokens if request.max_tokens is not None else self.defaults.get("max_tokens")

    def text_deltas(
        self, request: LLMInput, reply: ReplyText, out: Any, prompt_tokens: int | None = None
    ) -> list[TextDelta]:
        """The text deltas of one vLLM output (`RequestOutput`), the last one's when it finished,
        which reports `prompt_tokens` (default: the prompt vLLM ran)."""
        if reply.finished:
            return []  # a stop string ended the reply; vLLM may still be generating
        completion = out.outputs[0]
        deltas = []
        for index, token in enumerate(completion.token_ids):
            step = completion.logprobs[index] if completion.logprobs else None
            if (delta := reply.push(token, _logprobs(step, token, request.top_logprobs))) is not None:
                deltas.append(delta)
            if reply.stopped:
                break
        if reply.stopped or completion.finish_reason is not None:
            reason: FinishReason = "length" if completion.finish_reason == "length" else "stop"
            if prompt_tokens is None:
                prompt_tokens = len(out.prompt_token_ids or [])
            deltas.append(reply.finish(reason, prompt_tokens))
        return deltas

    async def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()  # AsyncLLM.__del__ does not stop the engine's processes reliably


class VLLMExecutor(VLLMGeneration[Stream[TextDelta]]):
    """Streams the text vLLM generates for a conversation with precomputed embeddings or raw media."""

    async def stream(self, task_input: Any) -> AsyncIterator[TextDelta]:
        request = LLMInput.model_validate(task_input)
        reply = self.reply(request)
        async for out in self.outputs(request):
            for delta in self.text_deltas(request, reply, out):
                yield delta
            if reply.stopped:
                return  # leaving the engine's generator aborts the request


class HandoffSide(VLLMGeneration[GenerationOutputT]):
    """One side (`role`) of a prefill → decode hand-off: the engine's KV connector, and the sweep of
    the hand-off folders done with (`sweep_handoffs`), every grace period while the replica runs."""

    role = ""

    def engine_settings(self) -> dict[str, Any]:
        import torch

        cuda = torch.cuda.is_available()
        return {**super().engine_settings(), **handoff_settings(self.task, self.role, cuda=cuda)}

    async def load(self) -> None:
        await super().load()
        self._sweeping = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        settings = self.task
        assert isinstance(settings, VLLMHandoffSettings)  # handoff_settings refused others at load
        while True:
            await asyncio.sleep(settings.handoff_grace_s)
            await asyncio.to_thread(
                sweep_handoffs, settings.handoff_dir, settings.handoff_ttl_s, settings.handoff_grace_s
            )

    async def close(self) -> None:
        sweeping = getattr(self, "_sweeping", None)
        if sweeping is not None:
            sweeping.cancel()
        await super().close()


class VLLMPrefillExecutor(HandoffSide[Handoff]):
    """The prefill side of a prefill/decode split: runs the prompt and its first token; the KV
    connector saves the prompt's KV cache for decode, which goes on from the `Handoff`. A reply that
    ended at its first token needs no decode (unless an Omni thinker's talker needs the prompt's
    hidden states): its hand-off is marked taken at once, for the sweep."""

    role = "kv_producer"

    async def run(self, task_input: Any) -> Handoff:
        request = LLMInput.model_validate(task_input)
        last = None
        async for out in self.outputs(request.model_copy(update={"max_tokens": 1})):
            last = out
        if last is None or not last.outputs[0].token_ids:
            raise ExecutorUnhealthy(f"vLLM engine of {self.task.model} ended a prefill without a token")
        completion = last.outputs[0]
        token = completion.token_ids[0]
        step = completion.logprobs[0] if completion.logprobs else None
        ended: FinishReason | None = None
        if completion.finish_reason == "stop":  # an end token
            ended = "stop"
        elif self.max_tokens(request) == 1:
            ended = "length"
        folder = (last.kv_transfer_params or {}).get(HANDOFF_FOLDER)
        if ended and not request.speech and folder:
            await asyncio.to_thread(mark_taken, folder)
        return Handoff(
            token=token,
            logprobs=_logprobs(step, token, request.top_logprobs),
            finish_reason=ended,
            prompt_tokens=len(last.prompt_token_ids or []),
        )


class DecodeSide(HandoffSide[GenerationOutputT]):
    """The decode side of a prefill/decode split: goes on from prefill's first token, the prompt's KV
    cache loaded from prefill's hand-off rather than computed (the last partial block is computed again)."""

    role = "kv_consumer"

    def continuation(self, request: DecodeInput, prompt: dict[str, Any]) -> tuple[dict[str, Any], LLMInput]:
        """The engine's prompt and request that go on from the hand-off: the prompt tokenized as vLLM
        tokenizes its text (so it expands the media placeholders as it did for prefill, and the KV
        is found under the same tokens and media), then the first token, and the tokens left to
        generate. A reply that ended at its first token has the prompt alone and one token (an Omni
        thinker's talker needs the prompt's hidden states, which only an engine run gives here)."""
        handoff = request.handoff
        tokens = self.tokenizer.encode(prompt["prompt"])
        rest = {key: value for key, value in prompt.items() if key != "prompt"}
        if request.json_schema is not None:
            # vLLM's grammar cannot be handed prefill's token: decode generates the whole reply
            # (the prompt's KV cache still comes from prefill), its first token again.
            return {"prompt_token_ids": tokens, **rest}, request
        if handoff.finish_reason is not None:
            return {"prompt_token_ids": tokens, **rest}, request.model_copy(update={"max_tokens": 1})
        limit = self.max_tokens(request)
        left = request if limit is None else request.model_copy(update={"max_tokens": limit - 1})
        return {"prompt_token_ids": [*tokens, handoff.token], **rest}, left

    def opening(self, request: DecodeInput, reply: ReplyText) -> list[TextDelta]:
        """The reply's first text delta, prefill's token (and its end, if the reply ended there or at a
        stop string)."""
        handoff = request.handoff
        deltas = []
        if (delta := reply.push(handoff.token, handoff.logprobs)) is not None:
            deltas.append(delta)
        if reply.stopped or handoff.finish_reason is not None:
            deltas.append(reply.finish(handoff.finish_reason or "stop", handoff.prompt_tokens))
        return deltas


class VLLMDecodeExecutor(DecodeSide[Stream[TextDelta]]):
    """The decode side of a prefill/decode split of an LLM: streams the reply from prefill's first token on.

    Greedy replies equal one engine's, token for token and log-probability for log-probability.
    What differs: the first token is part of decode's prompt, so vLLM's presence and frequency
    penalties do not count it, and a seeded sampler draws from another point of its sequence.
    """

    async def stream(self, task_input: Any) -> AsyncIterator[TextDelta]:
        request = DecodeInput.model_validate(task_input)
        reply = self.reply(request)
        if request.json_schema is None:  # a JSON reply is generated whole here (`continuation`)
            for delta in self.opening(request, reply):
                yield delta
            if reply.finished:
                return
        prompt, rest = self.continuation(request, await self.prompt(request))
        async for out in self.outputs(rest, prompt=prompt):
            for delta in self.text_deltas(request, reply, out, prompt_tokens=request.handoff.prompt_tokens):
                yield delta
            if reply.stopped:
                return  # leaving the engine's generator aborts the request


# The sampling fields that fall back to the checkpoint's generation config when a request leaves them unset.
_DEFAULTED = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def checkpoint_sampling(config: Any) -> dict[str, Any]:
    """The sampling a checkpoint's generation config asks for, as vLLM's `SamplingParams` fields:
    greedy unless it samples (transformers' rule), then its temperature, top_p, top_k, min_p and
    repetition penalty; its `max_new_tokens` as `max_tokens`."""
    defaults: dict[str, Any] = {"temperature": 0.0}
    if config.do_sample:
        defaults["temperature"] = config.temperature if config.temperature is not None else 1.0
        for name in ("top_p", "top_k", "min_p", "repetition_penalty"):
            if getattr(config, name, None) is not None:
                defaults[name] = getattr(config, name)
    if config.max_new_tokens is not None:
        defaults["max_tokens"] = config.max_new_tokens
    return defaults


def _logprobs(step: Any, token: int, top: int | None) -> tuple[float, list[tuple[int, float]]] | None:
    """A vLLM step's log-probabilities (`{id: Logprob}`: the `top` most likely, and the chosen token)
    as `ReplyText.push` takes them: the chosen token's, and the `top` most likely's by rank."""
    if step is None or top is None:
        return None
    ranked = sorted(step.items(), key=lambda item: item[1].rank)
    return step[token].logprob, [(i, entry.logprob) for i, entry in ranked[:top]]


def _decoded(media: list[Any]) -> dict[str, list[Any]]:
    """Raw media by modality as vLLM takes it: PIL images, (samples, rate) for audio."""
    from prismserve.models.media import load_audio, load_image

    out: dict[str, list[Any]] = {}
    for m in media:
        item = load_image(m.data) if m.modality == "image" else (load_audio(m.data, AUDIO_RATE), AUDIO_RATE)
        out.setdefault(m.modality, []).append(item)
    return out
