"""OmniTask: encoders, thinker, talker and vocoder of an any-to-any model (Qwen-Omni), split or whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import Field

from prismserve.protocol.chat import ChatChunk, ChatRequest, TextDelta
from prismserve.task import Stream, Task, TaskDefinitionError, TaskOutput, UnitTask
from prismserve.tasklib.gpus import component_gpus
from prismserve.tasklib.media_tokens import MediaTokens
from prismserve.tasklib.mllm import TextOutput, handoff_dir, llm_input
from prismserve.tasklib.units import (
    DecodeInput,
    Dtype,
    EncoderTask,
    MediaModality,
    OmniMonolithTask,
    TalkerInput,
    TalkerTask,
    ThinkerTask,
    VLLMThinkerDecodeTask,
    VLLMThinkerPrefillTask,
    VLLMThinkerTask,
    VocoderInput,
    VocoderTask,
)


class OmniOutput(TaskOutput):
    """Streamed text, and streamed 16-bit mono PCM audio (24 kHz) when speech was asked for."""

    text: Stream[TextDelta]
    audio: Stream[bytes] | None = None


class OmniTask(Task[ChatRequest, OmniOutput]):
    """An Omni model. `monolith`: one deployment runs everything with transformers' `generate` (the
    paper's baseline). Otherwise thinker, talker and vocoder are deployments of their own, the talker
    and vocoder invoked only when audio is asked for; `encoder_fission` also splits the encoders out.

    `engine="vllm"` runs the thinker on vLLM (`VLLMThinkerTask`, Qwen2.5-Omni and Qwen3-Omni, with `vllm` settings
    such as `max_model_len` or `engine_args`). `dtype` is every component's weights' dtype
    (`ModelSettings.dtype`; a `vllm["dtype"]` overrides it for the thinker on vLLM). vLLM 0.32 takes audio only raw, so with `encoder_fission` only
    the image encoder is split out and the thinker deployment keeps the audio tower.

    With `prefill_decode` (vLLM only) the thinker is two deployments, TriInfer's P and D: prefill
    computes the prompt and the first token, decode the rest and the talker's conditioning, the KV
    cache (the talker's captured layer with it) handed over by vLLM's KV connector
    (`VLLMThinkerPrefillTask`, `VLLMThinkerDecodeTask`; GPUs `gpus["prefill"]`, `gpus["decode"]`;
    the hand-off directory as `MLLMTask`'s).

    `modalities` are the media it takes, each an encoder deployment with `encoder_fission`; "video"
    (transformers only) is the vision tower's on clips, and a request's `use_audio_in_video` sends
    a clip's soundtrack to the audio encoder as well.

    `gpus` sets the GPUs per replica of components (shares below 1 share a GPU:
    `{"thinker": 0.8, "image": 0.1, "audio": 0.1}`); components it leaves out get their default (1).
    """

    model: str
    modalities: tuple[MediaModality, ...] = ("image", "audio")
    encoder_fission: bool = True
    monolith: bool = False
    speaker: str | None = None  # the default voice; a request's `voice` overrides it
    max_codes: int = Field(default=600, ge=1)
    engine: Literal["transformers", "vllm"] = "transformers"
    prefill_decode: bool = False
    vllm: dict[str, Any] = Field(default_factory=dict)
    dtype: Dtype = "auto"
    # GPUs per replica by component: encoders by modality, "thinker" (or "prefill" and "decode"),
    # "talker", "vocoder"; "whole" (monolith).
    gpus: dict[str, float] = Field(default_factory=dict)
    # How the model's processor counts media tokens (token-aware routing, the sim engines' prompts;
    # default: Qwen-VL's rules), what it leaves unset read from the checkpoint (`of_checkpoint`).
    media_tokens: MediaTokens = Field(default_factory=MediaTokens)
    # MiB of recent media outputs each encoder replica keeps (`EncoderSettings.cache_mib`; 0: none).
    encoder_cache_mib: int = Field(default=256, ge=0)

    def post_init(self) -> None:
        self.counting = self.media_tokens.of_checkpoint(self.model)
        if self.prefill_decode and (self.engine != "vllm" or self.monolith):
            raise TaskDefinitionError(
                "OmniTask(prefill_decode=True) splits the thinker's vLLM engine into prefill and decode: "
                "set engine='vllm' (and monolith=False)"
            )
        if self.engine == "vllm" and "video" in self.modalities:
            raise TaskDefinitionError(
                "OmniTask(engine='vllm') takes no video yet (prismserve's vLLM executors take none): "
                "leave 'video' out of modalities, or use engine='transformers'"
            )
        if self.monolith:
            if self.engine != "transformers":
                raise TaskDefinitionError(
                    "the Omni monolith is transformers' own end-to-end generate: "
                    f"engine={self.engine!r} applies to the split model (monolith=False)"
                )
            shares = component_gpus("OmniTask(monolith=True)", self.gpus, {"whole": OmniMonolithTask})
            self.whole = OmniMonolithTask(
                model=self.model, max_codes=self.max_codes, gpus=shares["whole"], dtype=self.dtype
            )
            return
        vllm = self.engine == "vllm"
        fissioned: list[MediaModality] = (
            [m for m in self.modalities if not (vllm and m == "audio")] if self.encoder_fission else []
        )
        owner = (
            f"OmniTask(engine={self.engine!r}, encoder_fission={self.encoder_fission}, "
            f"prefill_decode={self.prefill_decode})"
        )
        components: dict[str, type[UnitTask[Any, Any]]] = dict.fromkeys(fissioned, EncoderTask)
        thinker: dict[str, type[UnitTask[Any, Any]]] = (
            {"prefill": VLLMThinkerPrefillTask, "decode": VLLMThinkerDecodeTask}
            if self.prefill_decode
            else {"thinker": VLLMThinkerTask if vllm else ThinkerTask}
        )
        components |= {**thinker, "talker": TalkerTask}
        shares = component_gpus(owner, self.gpus, {**components, "vocoder": VocoderTask})
        if self.encoder_fission:
            self.encoders = {
                m: EncoderTask(
                    model=self.model,
                    modality=m,
                    gpus=shares[m],
                    cache_mib=self.encoder_cache_mib,
                    dtype=self.dtype,
                )
                for m in fissioned
            }
        self.thinker: ThinkerTask | VLLMThinkerTask
        whole = not self.encoder_fission
        settings = {"dtype": self.dtype, **self.vllm}
        if self.prefill_decode:
            settings = {"handoff_dir": handoff_dir(self.model, settings), **settings}
            self.prefill = VLLMThinkerPrefillTask(
                model=self.model, with_encoders=whole, gpus=shares["prefill"], **settings
            )
            self.decode = VLLMThinkerDecodeTask(
                model=self.model, with_encoders=whole, gpus=shares["decode"], **settings
            )
        elif vllm:
            self.thinker = VLLMThinkerTask(
                model=self.model, with_encoders=whole, gpus=shares["thinker"], **settings
            )
        else:
            self.thinker = ThinkerTask(
                model=self.model, with_encoders=whole, gpus=shares["thinker"], dtype=self.dtype
            )
        self.talker = TalkerTask(model=self.model, gpus=shares["talker"], dtype=self.dtype)
        self.vocoder = VocoderTask(model=self.model, gpus=shares["vocoder"], dtype=self.dtype)

    def invoke(self, request: ChatRequest) -> OmniOutput:
        speaker = request.voice or self.speaker
        speech: dict[str, Any] = {"speech": request.wants_audio, "speaker": speaker}
        if self.monolith:
            out = self.whole.invoke(
                llm_input(request, self.model, self.modalities, None, counting=self.counting, **speech)
            )
            return OmniOutput(text=out.text, audio=out.audio if request.wants_audio else None)
        encoders = self.encoders if self.encoder_fission else None
        prompt = llm_input(request, self.model, self.modalities, encoders, counting=self.counting, **speech)
        if self.prefill_decode:
            thought = self.decode.invoke(DecodeInput(**prompt.__dict__, handoff=self.prefill.invoke(prompt)))
        else:
            thought = self.thinker.invoke(prompt)
        if not request.wants_audio:
            return OmniOutput(text=thought.text)
        talk = TalkerInput(
            thinker=thought.talker, max_codes=self.max_codes, temperature=request.temperature or 0.0
        )
        codes = self.talker.invoke(talk)
        seed = request.seed or 0
        return OmniOutput(
            text=thought.text,
            audio=self.vocoder.invoke(VocoderInput(codes=codes, speaker=speaker, seed=seed)),
        )


async def chat_chunks(output: OmniOutput | TextOutput) -> AsyncIterator[ChatChunk]:
    """An LLM's or Omni model's output as the chat API streams it: text deltas (with their token
    counts, log-probabilities and finish reason), then audio chunks (24 kHz PCM) if any."""
    async for delta in output.text:
        yield ChatChunk.of(delta)
    audio = getattr(output, "audio", None)
    if audio is not None:
        async for chunk in audio:
            yield ChatChunk(audio=chunk)
