"""MLLMTask: encoders + LLM, with the encoders fissioned into their own deployments or not (000 §3)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Literal

from pydantic import Field

from prismserve.protocol.chat import (
    AudioPart,
    ChatMessage,
    ChatRequest,
    ImagePart,
    TextDelta,
    TextPart,
    VideoPart,
)
from prismserve.task import InvalidInputError, Stream, Task, TaskDefinitionError, TaskOutput
from prismserve.tasklib.gpus import component_gpus
from prismserve.tasklib.media_tokens import MediaTokens
from prismserve.tasklib.units import (
    DecodeInput,
    Dtype,
    EncodedMedia,
    EncoderTask,
    LLMInput,
    LLMTask,
    MediaItem,
    MediaModality,
    VLLMDecodeTask,
    VLLMPrefillTask,
    VLLMTask,
)

_MODALITY: dict[type, MediaModality] = {ImagePart: "image", AudioPart: "audio", VideoPart: "video"}


class TextOutput(TaskOutput):
    """Streamed text."""

    text: Stream[TextDelta]


async def reply_text(text: Stream[TextDelta]) -> str:
    """The whole text of an LLM's streamed reply."""
    return "".join(delta.text for delta in await text.collect())


def conversation(
    request: ChatRequest, counting: MediaTokens | None = None
) -> tuple[list[dict[str, Any]], list[MediaItem]]:
    """The request as a chat-template conversation with media placeholders, and its media in that
    order, each with its tokens counted by `counting` (the model's processor rules). With
    `use_audio_in_video` a video's soundtrack follows it as an audio item of the video's bytes (the
    audio encoder decodes the container's audio stream), its placeholder marked `audio_in_video`."""
    counting = counting or MediaTokens()
    messages, media = [], []
    for message in request.messages:
        content: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
                continue
            modality = _MODALITY[type(part)]
            content.append({"type": modality})
            media.append(
                MediaItem(modality=modality, data=part.data, tokens=counting.count(modality, part.data))
            )
            if modality == "video" and request.use_audio_in_video:
                content[-1]["audio_in_video"] = True
                tokens = counting.count("audio", part.data)
                media.append(MediaItem(modality="audio", data=part.data, tokens=tokens))
        messages.append({"role": message.role, "content": content, **_tool_fields(message)})
    return messages, media


def _tool_fields(message: ChatMessage) -> dict[str, Any]:
    """A message's tool calls or the call it answers, as chat templates read them (arguments as
    an object where they parse: templates write them with `tojson`)."""
    if message.tool_call_id is not None:
        return {"tool_call_id": message.tool_call_id}
    if not message.tool_calls:
        return {}
    calls = []
    for call in message.tool_calls:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = call.arguments
        calls.append(
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}
        )
    return {"tool_calls": calls}


def llm_input(
    request: ChatRequest,
    model: str,
    modalities: tuple[MediaModality, ...],
    encoders: dict[MediaModality, EncoderTask] | None,
    *,
    counting: MediaTokens | None = None,
    **extra: Any,
) -> LLMInput:
    """An LLM's input for `request`: media encoded by `encoders` (invoked here), or raw without them;
    media of a modality `encoders` lacks stay raw (vLLM's Omni thinker takes audio only raw). Media
    tokens are counted by `counting` (token-aware routing reads them)."""
    messages, media = conversation(request, counting)
    unsupported = sorted({m.modality for m in media} - set(modalities))
    if unsupported:
        raise InvalidInputError(f"{model} takes {', '.join(modalities)} input, not {', '.join(unsupported)}")
    sampling = {**request.sampling(), "tools": request.tools, **extra}
    if encoders is None:
        return LLMInput(conversation=messages, media=media, **sampling)
    encoded, raw = [], []
    for item in media:
        if item.modality not in encoders:
            raw.append(item)
            continue
        out = encoders[item.modality].invoke(item)
        encoded.append(
            EncodedMedia(modality=item.modality, embeddings=out.embeddings, meta=out.meta, tokens=item.tokens)
        )
    return LLMInput(conversation=messages, encoded=encoded, media=raw, **sampling)


class MLLMTask(Task[ChatRequest, TextOutput]):
    """A multimodal LLM. With `encoder_fission` each media item goes to its modality's encoder
    deployment and the LLM gets embeddings; without, one deployment takes raw media.

    `encoder_model` lets LLMs of different checkpoints share one encoder deployment (002 Listing 2);
    `modalities` are the encoders the model has. `engine` runs the LLM on transformers or on vLLM
    (`VLLMTask`, with `vllm` settings such as `max_model_len` or `engine_args`). `dtype` is every
    component's weights' dtype (`ModelSettings.dtype`; a `vllm["dtype"]` overrides it for the vLLM
    stage). `gpus` sets the GPUs per
    replica of components (`{"image": 0.2, "llm": 0.8}`; on vLLM `{"llm": 2}` is tensor parallelism).

    With `prefill_decode` (vLLM only) the LLM is two deployments, TriInfer's P and D: prefill
    computes the prompt and the first token, decode streams the rest, the KV cache handed over by
    vLLM's KV connector (`VLLMPrefillTask`, `VLLMDecodeTask`; their GPUs are `gpus["prefill"]` and
    `gpus["decode"]`). The hand-off directory is `vllm["handoff_dir"]`, by default one under the
    system's temporary directory per model and engine settings.
    """

    model: str
    encoder_model: str | None = None
    modalities: tuple[MediaModality, ...] = ("image",)
    encoder_fission: bool = True
    engine: Literal["transformers", "vllm"] = "transformers"
    prefill_decode: bool = False
    vllm: dict[str, Any] = Field(default_factory=dict)
    dtype: Dtype = "auto"
    # GPUs per replica by component: the encoders by modality, and "llm".
    gpus: dict[str, float] = Field(default_factory=dict)
    # How the model's processor counts media tokens (token-aware routing, the sim engines' prompts;
    # default: Qwen-VL's rules), what it leaves unset read from the checkpoint (`of_checkpoint`).
    media_tokens: MediaTokens = Field(default_factory=MediaTokens)
    # MiB of recent media outputs each encoder replica keeps (`EncoderSettings.cache_mib`; 0: none).
    encoder_cache_mib: int = Field(default=256, ge=0)

    def post_init(self) -> None:
        if self.prefill_decode and self.engine != "vllm":
            raise TaskDefinitionError(
                "MLLMTask(prefill_decode=True) splits a vLLM engine into prefill and decode: set engine='vllm'"
            )
        self.counting = self.media_tokens.of_checkpoint(self.encoder_model or self.model)
        encoders = list(self.modalities) if self.encoder_fission else []
        owner = f"MLLMTask(encoder_fission={self.encoder_fission}, prefill_decode={self.prefill_decode})"
        llm: dict[str, Any] = (
            {"prefill": VLLMPrefillTask, "decode": VLLMDecodeTask}
            if self.prefill_decode
            else {"llm": VLLMTask if self.engine == "vllm" else LLMTask}
        )
        shares = component_gpus(owner, self.gpus, {**dict.fromkeys(encoders, EncoderTask), **llm})
        if self.encoder_fission:
            source = self.encoder_model or self.model
            self.encoders = {
                m: EncoderTask(
                    model=source,
                    modality=m,
                    gpus=shares[m],
                    cache_mib=self.encoder_cache_mib,
                    dtype=self.dtype,
                )
                for m in encoders
            }
        self.llm: VLLMTask | LLMTask
        whole = not self.encoder_fission
        vllm = {"dtype": self.dtype, **self.vllm}
        if self.prefill_decode:
            settings = {"handoff_dir": handoff_dir(self.model, vllm), **vllm}
            self.prefill = VLLMPrefillTask(
                model=self.model, with_encoders=whole, gpus=shares["prefill"], **settings
            )
            self.decode = VLLMDecodeTask(
                model=self.model, with_encoders=whole, gpus=shares["decode"], **settings
            )
        elif self.engine == "vllm":
            self.llm = VLLMTask(model=self.model, with_encoders=whole, gpus=shares["llm"], **vllm)
        else:
            self.llm = LLMTask(model=self.model, with_encoders=whole, gpus=shares["llm"], dtype=self.dtype)

    def invoke(self, request: ChatRequest) -> TextOutput:
        encoders = self.encoders if self.encoder_fission else None
        prompt = llm_input(request, self.model, self.modalities, encoders, counting=self.counting)
        if not self.prefill_decode:
            return TextOutput(text=self.llm.invoke(prompt))
        handoff = self.prefill.invoke(prompt)
        return TextOutput(text=self.decode.invoke(DecodeInput(**prompt.__dict__, handoff=handoff)))


def handoff_dir(model: str, vllm: dict[str, Any]) -> str:
    """The default directory a prefill deployment hands the KV cache over to its decode deployment in:
    one per model and engine settings (a KV cache is only good for an engine built like the one that
    computed it), under the system's temporary directory."""
    settings = json.dumps([model, vllm], sort_keys=True, default=str)
    return os.path.join(
        tempfile.gettempdir(), "prismserve-kv", hashlib.sha256(settings.encode()).hexdigest()[:16]
    )
