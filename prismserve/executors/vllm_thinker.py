"""An Omni model's thinker on vLLM's async engine (`VLLMThinkerTask`; Qwen2.5-Omni, Qwen3-Omni): text
streamed per token and, beside it, the talker's conditioning, as `ThinkerExecutor` gives them on
transformers.

The talker needs, at every position the thinker was fed (prompt and reply), the thinker's input
embedding and one layer's hidden state (Qwen2.5-Omni: the last, after the final norm; Qwen3-Omni: the
layer the talker listens to). vLLM hands hidden states out without a fork: the engine runs the
`extract_hidden_states` speculative method, which caches that layer's output (before any norm) in the
KV pool, and `vllm_extensions.CPUHiddenStatesConnector` appends a running request's rows to a file
of its own step by step, and writes all of them to a safetensors file when it finishes. Here the
rows are read as the outputs come, the input embeddings looked up in the thinker's embedding table
(read from the checkpoint, with the final norm where the family needs it), and the conditioning
built by the same class the transformers thinker uses (the family's `ConditioningBuilder`); the
saved file completes and checks them. Only requests that ask for speech are saved.

Media: images arrive as the encoder deployment's embeddings (or raw with `with_encoders`); audio
arrives raw, because vLLM 0.32's Omni thinkers take no audio embeddings and run the audio tower
themselves — the thinker deployment keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from prismserve.executors.base import media_rejected
from prismserve.executors.text import ReplyText
from prismserve.executors.vllm_llm import (
    AUDIO_RATE,
    DecodeSide,
    GenerationOutputT,
    VLLMGeneration,
    VLLMPrefillExecutor,
)
from prismserve.executors.vllm_plugin import EXTENSIONS
from prismserve.models import qwen2_5_omni, qwen3_omni
from prismserve.models.conditioning import ConditioningBuilder, Item
from prismserve.protocol.chat import TextDelta
from prismserve.task import InvalidInputError, Stream
from prismserve.task.components import DecodeInput, Handoff, LLMInput, ThinkerOutput

CONNECTOR = "CPUHiddenStatesConnector"
CONNECTOR_MODULE = EXTENSIONS


class ThinkerEngine(VLLMGeneration[GenerationOutputT]):
    """An Omni thinker's vLLM engine, which caches the captured layer's states and hands them out
    through `CPUHiddenStatesConnector` — beside a prefill/decode KV hand-off where there is one (both
    through vLLM's `MultiConnector`; the hand-off carries the captured layer's cache too, so decode's
    rows are whole) — and what a request to it gives (`think`): text and, when speech is asked for,
    the talker's conditioning."""

    async def load(self) -> None:
        config = json.loads(_checkpoint_file(self.task.model, "config.json").read_text())
        readout = READOUTS.get(config.get("model_type", ""))
        if readout is None:
            raise ValueError(
                f"{self.task.model}: no vLLM thinker for model_type {config.get('model_type')!r}; "
                f"it runs {sorted(READOUTS)}"
            )
        self.states_dir = tempfile.mkdtemp(prefix="prismserve-thinker-states-")
        self.readout: ThinkerReadout = await asyncio.to_thread(readout, self.task.model, config)
        await super().load()

    def engine_settings(self) -> dict[str, Any]:
        settings = super().engine_settings()
        states: dict[str, Any] = {
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": self.states_dir},
        }
        handoff = settings.get("kv_transfer_config")
        if handoff is not None:  # a prefill/decode hand-off beside: vLLM's MultiConnector runs both
            policy = "kv_load_failure_policy"  # the engine's, read from the outer config
            states = {
                "kv_connector": "MultiConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "connectors": [{k: v for k, v in handoff.items() if k != policy}, states]
                },
                **({policy: handoff[policy]} if policy in handoff else {}),
            }
        return {
            **settings,
            # One layer's output (before any norm) at every position, cached beside the KV.
            "speculative_config": {
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {
                    "hf_config": {"eagle_aux_hidden_state_layer_ids": [self.readout.layer]}
                },
            },
            "kv_transfer_config": states,
        }

    def check_media(self, request: LLMInput) -> None:
        if self.task.with_encoders:
            return
        if any(e.modality == "audio" for e in request.encoded):
            raise InvalidInputError(
                f"the vLLM thinker of {self.task.model} takes audio raw, not as embeddings (vLLM 0.32 runs "
                "the audio tower itself): do not fission the audio encoder (OmniTask(engine='vllm') does not)"
            )
        raw = sorted({m.modality for m in request.media} - {"audio"})
        if raw:
            raise InvalidInputError(
                f"this deployment of {self.task.model} has no {', '.join(raw)} encoder: send embeddings, "
                "not raw media"
            )

    def speaker(self, request: LLMInput) -> str | None:
        """The checkpoint's voice `request` asks for; None without speech (an unknown one: MediaError)."""
        return self.readout.speaker(request.speaker) if request.speech else None

    async def think(
        self,
        request: LLMInput,
        prompt: dict[str, Any],
        speaker: str | None,
        reply: ReplyText,
        after: Prefilled | None = None,
    ) -> ThinkerOutput:
        """Generate for `request` from its built `prompt`: text streamed per token (through `reply`)
        and, with a `speaker`, the talker's conditioning streamed beside it; `after` a prefill, going
        on from the reply's start."""
        # Only requests with transfer parameters are saved (CPUHiddenStatesConnector); their rows are
        # also streamed to a file of their own while they run.
        rows_path = os.path.join(self.states_dir, f"{uuid.uuid4().hex}.rows")
        transfer = {"include_output_tokens": True, "stream_rows_path": rows_path}
        saving = {"kv_transfer_params": transfer} if speaker is not None else None
        text: Stream[TextDelta] = Stream("text")
        talker: Stream[Any] = Stream("talker")
        for delta in after.deltas if after else ():
            text.put(delta)
        if reply.finished and speaker is None:
            text.close()
            talker.close()
            return ThinkerOutput(text=text, talker=talker)
        outputs = self.outputs(request, prompt=prompt, extra_args=saving)
        # The first output (or vLLM's refusal of the input, an InvalidInputError) before answering.
        first = await anext(outputs, None)
        replying = after is None or after.in_prompt  # the engine's tokens are the reply's
        prompt_tokens = after.prompt_tokens if after else None

        async def generate() -> None:
            speech = None
            final = None
            try:
                if speaker is not None and first is not None:
                    extra = await asyncio.to_thread(self.media_positions, request, prompt)
                    prompt_ids = list(first.prompt_token_ids or [])
                    if after is not None and after.in_prompt:
                        prompt_ids.pop()  # prefill's token, fed to the builder as the reply's first
                    builder = self.readout.builder(prompt_ids, speaker, talker.put, extra)
                    speech = _Speech(self.readout, builder, prompt_ids, rows_path)
                    if after is not None:
                        speech.generated([after.token])
                pending = [first] if first is not None else []
                async for out in _chain(pending, outputs):
                    if replying:
                        taken = reply.taken
                        for delta in self.text_deltas(request, reply, out, prompt_tokens):
                            text.put(delta)
                        if speech is not None:  # the reply's tokens only: none past a stop string
                            speech.generated(
                                out.outputs[0].token_ids[: reply.taken - taken], ended=reply.stopped
                            )
                    final = out
            except asyncio.CancelledError:  # the request was released: vLLM aborts it
                _remove(rows_path)
                raise
            except Exception as exc:  # noqa: BLE001 - both consumers get the thinker's error
                text.fail(exc)
                talker.fail(exc)
                _remove(rows_path)
                return
            text.close()
            try:
                if speech is not None:
                    path = (final.kv_transfer_params or {}).get("hidden_states_path") if final else None
                    if path is None:
                        raise RuntimeError("vLLM saved no hidden states for this request")
                    speech.finish(await asyncio.to_thread(_saved, path))
                talker.close()
            except Exception as exc:  # noqa: BLE001 - the talker's consumer gets the error
                talker.fail(exc)
            finally:
                _remove(rows_path)

        self.spawn(generate())
        return ThinkerOutput(text=text, talker=talker)

    def media_positions(self, request: LLMInput, prompt: dict[str, Any]) -> dict[str, np.ndarray]:
        """What the talker needs to place the prompt's media (its own M-RoPE): the images' grids and
        the audio clips' mel-feature lengths, in conversation order."""
        data = prompt.get("multi_modal_data", {})
        out: dict[str, np.ndarray] = {}
        images = data.get("image")
        if isinstance(images, dict):  # the encoder deployment's embeddings
            out["image_grid_thw"] = images["image_grid_thw"].numpy()
        elif images:  # raw: the grids vLLM's image processor makes of them
            out["image_grid_thw"] = self._processors.images(images=images, return_tensors="np")[
                "image_grid_thw"
            ]
        clips = data.get("audio")
        if clips:
            features = self._processors.audio(
                [samples for samples, _ in clips],
                sampling_rate=AUDIO_RATE,
                return_attention_mask=True,
                return_tensors="np",
            )
            out["audio_feature_lengths"] = features["attention_mask"].sum(-1)
        return out

    @cached_property
    def _processors(self) -> _Processors:
        return _Processors(self.task.model)

    async def close(self) -> None:
        await super().close()
        states = getattr(self, "states_dir", None)
        if states is not None:
            shutil.rmtree(states, ignore_errors=True)


class VLLMThinkerExecutor(ThinkerEngine[ThinkerOutput]):
    """Streams the thinker's text from vLLM and, when speech is asked for, the talker's conditioning."""

    async def run(self, task_input: Any) -> ThinkerOutput:
        request = LLMInput.model_validate(task_input)
        prompt = await self.prompt(request)  # bad input fails the call itself
        with media_rejected():
            speaker = self.speaker(request)
        return await self.think(request, prompt, speaker, self.reply(request))


class VLLMThinkerPrefillExecutor(ThinkerEngine[Handoff], VLLMPrefillExecutor):
    """The prefill side of a thinker split into prefill and decode: the prompt and the first token,
    the KV cache (the captured layer's too) handed over to decode. Saves no hidden states: decode's
    engine holds every position's after the hand-off."""

    async def run(self, task_input: Any) -> Handoff:
        with media_rejected():  # an unknown voice is refused before any work
            self.speaker(LLMInput.model_validate(task_input))
        return await super().run(task_input)


class VLLMThinkerDecodeExecutor(ThinkerEngine[ThinkerOutput], DecodeSide[ThinkerOutput]):
    """The decode side of a thinker split into prefill and decode: text from prefill's first token
    on and, when speech is asked for, the talker's conditioning of every position — prompt and reply —
    from this engine's hidden states (the prompt's cache came with the hand-off). A reply that ended
    at prefill's token still runs the engine when speech is asked for, on the prompt alone, for its rows."""

    async def run(self, task_input: Any) -> ThinkerOutput:
        request = DecodeInput.model_validate(task_input)
        reply = self.reply(request)
        with media_rejected():
            speaker = self.speaker(request)
        prompt, rest = self.continuation(request, await self.prompt(request))
        if request.json_schema is not None:  # generated whole here, prefill's token again (`continuation`)
            return await self.think(rest, prompt, speaker, reply)
        deltas = self.opening(request, reply)
        handoff = request.handoff
        after = Prefilled(deltas, handoff.token, handoff.finish_reason is None, handoff.prompt_tokens)
        return await self.think(rest, prompt, speaker, reply, after)


@dataclass(frozen=True)
class Prefilled:
    """Where a thinker's decode goes on from: the reply's first delta(s) (its end too, if it ended
    there), prefill's token, whether that token ends the engine's prompt (when the reply ended at
    it, it does not: the engine runs for the prompt's rows alone, its own token not the reply's), and
    the prompt's length as prefill counted it."""

    deltas: list[TextDelta]
    token: int
    in_prompt: bool
    prompt_tokens: int


class _Speech:
    """One speech request's talker conditioning, built while vLLM generates: the rows of the captured
    layer the connector streams to this request's file are fed to the family's builder as they
    come (the prompt's first, once all there, then one per token fed), the rest at the end from the
    file vLLM saved, which also checks every streamed row. A reply cut at a stop string is spoken up
    to its last token, as the transformers thinker speaks it: vLLM generates on (its saved file comes
    at the end of the request), but the positions past that token are not fed."""

    def __init__(
        self, readout: ThinkerReadout, builder: ConditioningBuilder, prompt_ids: list[int], path: str
    ) -> None:
        self.readout = readout
        self.builder = builder
        self.ids = list(prompt_ids)  # the positions' token ids: the prompt's, then the generated ones
        self.path = path
        self.width = readout.width * 4  # bytes per streamed float32 row
        self.streamed = np.zeros(
            (0, readout.width), np.float32
        )  # read, not yet fed (until the prompt is whole)
        self.read = 0  # rows read from the stream file
        self.fed = 0  # positions fed to the builder
        self.seen: list[np.ndarray] = []  # every streamed row, checked against the saved file
        self.ended = False  # the reply ended at a stop string: its last token is never fed

    def generated(self, tokens: list[int], ended: bool = False) -> None:
        """The thinker's next tokens (`ended`: the last of the reply, at a stop string): counted,
        then the rows vLLM streamed meanwhile fed."""
        for token in tokens:
            self.builder.add_token(token)
        self.ids += tokens
        self.ended = self.ended or ended
        self._feed(self._new_rows())

    def finish(self, file: dict[str, Any]) -> None:
        """The thinker is done: the rows vLLM saved (`_saved`: every position fed) complete the
        streamed ones."""
        import torch

        fed = file["token_ids"].tolist()
        if (fed[: len(self.ids) - 1] if self.ended else fed) != self.ids[:-1]:  # the last was never fed
            raise RuntimeError("the hidden states vLLM saved are of another sequence than this request's")
        saved = file["hidden_states"][:, 0].float()
        if self.seen and not torch.equal(torch.from_numpy(np.concatenate(self.seen)), saved[: self.read]):
            raise RuntimeError("the rows vLLM streamed differ from those it saved for this request")
        self._feed(saved[self.read :].numpy())
        self.builder.finish()

    def _new_rows(self) -> np.ndarray:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.read * self.width)
                data = f.read()
        except FileNotFoundError:  # nothing streamed yet
            return self.streamed[:0]
        rows = np.frombuffer(data[: len(data) // self.width * self.width], np.float32).reshape(
            -1, self.width // 4
        )
        self.read += len(rows)
        self.seen.append(rows)
        return rows

    def _feed(self, rows: np.ndarray) -> None:
        """Feed the builder the rows read so far whose tokens have come (the engine may be steps ahead
        of the outputs read here); the prompt's go in whole."""
        import torch

        rows = np.concatenate([self.streamed, rows])
        positions = len(self.ids) - 1 if self.ended else len(self.ids)  # a stopped reply's last: never fed
        known = min(len(rows), positions - self.fed)
        prompt = len(self.builder.prompt_ids)
        if self.fed + known < prompt or not known:
            self.streamed = rows
            return
        self.streamed = rows[known:]
        with torch.inference_mode():
            start = self.fed
            for part in (rows[: max(0, prompt - start)], rows[max(0, prompt - start) : known]):
                if len(part):
                    embeds, hidden = self.readout.states(
                        self.ids[start : start + len(part)], torch.from_numpy(part)
                    )
                    self.builder.add_states(embeds, hidden)
                    start += len(part)
            self.fed = start


def _saved(path: str) -> dict[str, Any]:
    """The hidden states file vLLM saved at `path` (`hidden_states`, `token_ids`), once written; deleted."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    try:
        return load_hidden_states(path)  # waits for the connector's write to finish
    finally:
        cleanup_hidden_states(path)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


class ThinkerWeights:
    """Tensors of the thinker read from the checkpoint's safetensors alone (no model is built): its
    embedding table, and its final RMSNorm's weight where the family needs it."""

    EMBED = "thinker.model.embed_tokens.weight"
    NORM = "thinker.model.norm.weight"

    def __init__(self, model: str, names: list[str]) -> None:
        from safetensors import safe_open

        self.tensors = {}
        for name, file in _weight_files(model, names).items():
            with safe_open(str(file), framework="pt") as f:
                self.tensors[name] = f.get_tensor(name)

    @property
    def width(self) -> int:
        """The thinker's hidden size."""
        return int(self.tensors[self.EMBED].shape[1])

    def embed(self, token_ids: list[int]) -> Any:
        """Input embeddings `[n, hidden]` of token ids."""
        import torch

        return self.tensors[self.EMBED][torch.tensor(token_ids, dtype=torch.long)]

    def norm(self, hidden: Any, eps: float) -> Any:
        """The thinker's final RMSNorm, computed as transformers' Qwen2 RMSNorm computes it."""
        import torch

        dtype = hidden.dtype
        x = hidden.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return self.tensors[self.NORM] * x.to(dtype)


class Qwen25OmniReadout:
    """Qwen2.5-Omni: the talker reads the last layer after the final norm; speakers in `spk_dict.pt`."""

    family = "qwen2.5-omni"

    def __init__(self, model: str, config: dict[str, Any]) -> None:
        import torch

        text = config["thinker_config"]["text_config"]
        self.layer = text["num_hidden_layers"]
        self.eps = text.get("rms_norm_eps", 1e-6)
        self.weights = ThinkerWeights(model, [ThinkerWeights.EMBED, ThinkerWeights.NORM])
        self.width = self.weights.width
        self.speakers = torch.load(_checkpoint_file(model, "spk_dict.pt"), weights_only=True)
        self.tokens = qwen2_5_omni.TalkerTokens.of(config)

    def speaker(self, name: str | None) -> str:
        """The checkpoint's speaker `name` (or its first); an unknown one is a MediaError."""
        return qwen2_5_omni.choose_speaker(self.speakers, name, self.family)

    def states(self, token_ids: list[int], saved: Any) -> tuple[Any, Any]:
        """The input embeddings and the talker's states of the positions fed (`token_ids`), from the
        rows vLLM saved of the captured layer."""
        return self.weights.embed(token_ids), self.weights.norm(saved, self.eps)

    def builder(
        self, prompt_ids: list[int], speaker: str, emit: Callable[[Item], object], extra: Item
    ) -> ConditioningBuilder:
        """The builder of one request's talker conditioning."""
        return qwen2_5_omni.Qwen25Conditioning(
            prompt_ids,
            self.weights.embed,
            speaker_bos=int(self.speakers[speaker]["bos_token"]),
            tokens=self.tokens,
            emit=emit,
            extra=extra,
        )


class Qwen3OmniReadout:
    """Qwen3-Omni: the talker reads layer `accept_hidden_layer` as it is (no norm); speakers in the config."""

    family = "qwen3-omni"

    def __init__(self, model: str, config: dict[str, Any]) -> None:
        thinker, talker = config["thinker_config"], config["talker_config"]
        self.layer = talker["accept_hidden_layer"]
        self.weights = ThinkerWeights(model, [ThinkerWeights.EMBED])
        self.width = self.weights.width
        self.speakers = talker["speaker_id"]
        self.media_ids = (thinker["audio_token_id"], thinker["image_token_id"], thinker["video_token_id"])
        self.assistant = (config["im_start_token_id"], config["assistant_token_id"])
        self.markers = [config["tts_bos_token_id"], config["tts_eos_token_id"], config["tts_pad_token_id"]]

    def speaker(self, name: str | None) -> str:
        """The checkpoint's speaker `name` (or its first; names are lower case); unknown: a MediaError."""
        return qwen2_5_omni.choose_speaker(self.speakers, name and name.lower(), self.family)

    def states(self, token_ids: list[int], saved: Any) -> tuple[Any, Any]:
        """The input embeddings and the talker's states (the captured layer as it is) of the positions fed."""
        return self.weights.embed(token_ids), saved

    def builder(
        self, prompt_ids: list[int], speaker: str, emit: Callable[[Item], object], extra: Item
    ) -> ConditioningBuilder:
        """The builder of one request's talker conditioning."""
        return qwen3_omni.Qwen3Conditioning(
            prompt_ids,
            self.weights.embed(self.markers),
            media_ids=self.media_ids,
            assistant=self.assistant,
            speaker_id=self.speakers[speaker],
            emit=emit,
            extra=extra,
        )


class ThinkerReadout(Protocol):
    """How one family's thinker hidden states, as vLLM saves them, become its talker's conditioning."""

    layer: int  # the layer vLLM captures (`eagle_aux_hidden_state_layer_ids`)
    width: int  # its hidden size

    def speaker(self, name: str | None) -> str: ...

    def states(self, token_ids: list[int], saved: Any) -> tuple[Any, Any]: ...

    def builder(
        self, prompt_ids: list[int], speaker: str, emit: Callable[[Item], object], extra: Item
    ) -> ConditioningBuilder: ...


# config.json `model_type` -> how its thinker's hidden states become the talker's conditioning.
READOUTS: dict[str, Callable[[str, dict[str, Any]], ThinkerReadout]] = {
    "qwen2_5_omni": Qwen25OmniReadout,
    "qwen3_omni_moe": Qwen3OmniReadout,
}


class _Processors:
    """The checkpoint's image processor and audio feature extractor (as vLLM loads them), on first use."""

    def __init__(self, model: str) -> None:
        from transformers import AutoImageProcessor, WhisperFeatureExtractor

        self.images = AutoImageProcessor.from_pretrained(model)
        self.audio = WhisperFeatureExtractor.from_pretrained(model)


async def _chain(first: list[Any], rest: Any) -> Any:
    """`first`'s items, then the async iterator `rest`'s."""
    for item in first:
        yield item
    async for item in rest:
        yield item


def _checkpoint_file(model: str, name: str) -> Path:
    """A file of the checkpoint (a local directory, or a hub id in the local cache or downloaded)."""
    local = Path(model, name)
    if local.is_file():
        return local
    from transformers.utils import cached_file

    found = cached_file(model, name)
    if found is None:
        raise FileNotFoundError(f"{model} has no {name}")
    return Path(found)


def _weight_files(model: str, names: list[str]) -> dict[str, Path]:
    """The safetensors file holding each named tensor (one file, or a sharded checkpoint's index)."""
    try:
        index = json.loads(_checkpoint_file(model, "model.safetensors.index.json").read_text())
    except OSError:  # not sharded
        single = _checkpoint_file(model, "model.safetensors")
        return dict.fromkeys(names, single)
    return {name: _checkpoint_file(model, index["weight_map"][name]) for name in names}
