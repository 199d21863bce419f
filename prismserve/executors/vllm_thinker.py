"""An Omni model's thinker on vLLM's async engine (`VLLMThinkerTask`; Qwen2.5-Omni, Qwen3-Omni): text
streamed per token, then the talker's conditioning, as `ThinkerExecutor` gives them on transformers.

The talker needs, at every position the thinker was fed (prompt and reply), the thinker's input
embedding and one layer's hidden state (Qwen2.5-Omni: the last, after the final norm; Qwen3-Omni: the
layer the talker listens to). vLLM hands hidden states out without a fork: the engine runs the
`extract_hidden_states` speculative method, which caches that layer's output (before any norm) in the
KV pool, and `vllm_extensions.CPUHiddenStatesConnector` writes a finished request's rows to a
safetensors file in this replica's scratch directory. Here the file is read (and deleted), the
input embeddings looked up in the thinker's embedding table (read from the checkpoint, with the final
norm where the family needs it), and the conditioning built by the same function the transformers
thinker uses (the family's `talker_conditioning`). Only requests that ask for speech are saved.

Media: images arrive as the encoder deployment's embeddings (or raw with `with_encoders`); audio
arrives raw, because vLLM 0.32's Omni thinkers take no audio embeddings and run the audio tower
themselves — the thinker deployment keeps it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from prismserve.executors.base import media_rejected
from prismserve.executors.vllm_llm import AUDIO_RATE, VLLMExecutor
from prismserve.models import qwen2_5_omni, qwen3_omni
from prismserve.task import InvalidInputError, Stream
from prismserve.tasklib.units import LLMInput, ThinkerOutput, VLLMThinkerTask

CONNECTOR = "CPUHiddenStatesConnector"
CONNECTOR_MODULE = "prismserve.executors.vllm_extensions"


class VLLMThinkerExecutor(VLLMExecutor):
    """Streams the thinker's text from vLLM and, when speech is asked for, the talker's conditioning."""

    task: VLLMThinkerTask

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
        self.readout.end_ids = self.end_ids

    def engine_settings(self) -> dict[str, Any]:
        return {
            **super().engine_settings(),
            # One layer's output (before any norm) at every position, cached beside the KV.
            "speculative_config": {
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {
                    "hf_config": {"eagle_aux_hidden_state_layer_ids": [self.readout.layer]}
                },
            },
            "kv_transfer_config": {
                "kv_connector": CONNECTOR,
                "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": self.states_dir},
            },
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

    async def run(self, task_input: Any) -> ThinkerOutput:
        request = LLMInput.model_validate(task_input)
        with media_rejected():
            prompt = self.prompt(request)  # bad input fails the call itself
            speaker = self.readout.speaker(request.speaker) if request.speech else None
        # Only requests with transfer parameters are saved (CPUHiddenStatesConnector).
        saving = {"kv_transfer_params": {"include_output_tokens": True}} if request.speech else None
        outputs = self.outputs(request, prompt=prompt, extra_args=saving)
        # The first output (or vLLM's refusal of the input, an InvalidInputError) before answering.
        first = await anext(outputs, None)
        text: Stream[str] = Stream("text")
        talker: Stream[Any] = Stream("talker")

        async def think() -> None:
            prompt_ids: list[int] = []
            generated: list[int] = []
            final = None
            decoder = self.decoder()
            try:
                pending = [first] if first is not None else []
                async for out in _chain(pending, outputs):
                    prompt_ids = prompt_ids or list(out.prompt_token_ids or [])
                    tokens = out.outputs[0].token_ids
                    generated += tokens
                    if delta := "".join(decoder.push(token) for token in tokens):
                        text.put(delta)
                    final = out
            except Exception as exc:  # noqa: BLE001 - both consumers get the thinker's error
                text.fail(exc)
                talker.fail(exc)
                return
            if tail := decoder.flush():
                text.put(tail)
            text.close()
            try:
                if speaker is not None:
                    path = (final.kv_transfer_params or {}).get("hidden_states_path") if final else None
                    if path is None:
                        raise RuntimeError("vLLM saved no hidden states for this request")
                    talker.put(
                        await asyncio.to_thread(
                            self.conditioning, request, prompt, prompt_ids, generated, path, speaker
                        )
                    )
                talker.close()
            except Exception as exc:  # noqa: BLE001 - the talker's consumer gets the error
                talker.fail(exc)

        self.spawn(think())
        return ThinkerOutput(text=text, talker=talker)

    def conditioning(
        self,
        request: LLMInput,
        prompt: dict[str, Any],
        prompt_ids: list[int],
        generated: list[int],
        path: str,
        speaker: str,
    ) -> dict[str, np.ndarray]:
        """The talker's conditioning from the hidden states vLLM saved at `path` (deleted after)."""
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )

        try:
            saved = load_hidden_states(path)  # waits for the connector's write to finish
        finally:
            cleanup_hidden_states(path)
        fed = prompt_ids + generated[:-1]  # the last token was generated, never fed
        if saved["token_ids"].tolist() != fed:
            raise RuntimeError(f"the hidden states at {path} are of another sequence than this request's")
        with torch.inference_mode():
            out = self.readout.conditioning(prompt_ids, generated, saved["hidden_states"][:, 0], speaker)
        return {**out, **self.media_positions(request, prompt)}

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
        self.speakers = torch.load(_checkpoint_file(model, "spk_dict.pt"), weights_only=True)
        self.tokens = qwen2_5_omni.TalkerTokens.of(config)
        self.end_ids: set[int] = set()

    def speaker(self, name: str | None) -> str:
        """The checkpoint's speaker `name` (or its first); an unknown one is a MediaError."""
        return qwen2_5_omni.choose_speaker(self.speakers, name, self.family)

    def conditioning(
        self, prompt_ids: list[int], generated: list[int], hidden: Any, speaker: str
    ) -> dict[str, np.ndarray]:
        """The talker's conditioning from the saved layer's rows at the positions fed."""
        import torch

        weights = self.weights
        return qwen2_5_omni.talker_conditioning(
            torch.tensor(prompt_ids),
            weights.embed(prompt_ids + generated[:-1]),
            weights.norm(hidden, self.eps),
            generated,
            weights.embed,
            speaker_bos=int(self.speakers[speaker]["bos_token"]),
            tokens=self.tokens,
            eos_ids=self.end_ids,
        )


class Qwen3OmniReadout:
    """Qwen3-Omni: the talker reads layer `accept_hidden_layer` as it is (no norm); speakers in the config."""

    family = "qwen3-omni"

    def __init__(self, model: str, config: dict[str, Any]) -> None:
        thinker, talker = config["thinker_config"], config["talker_config"]
        self.layer = talker["accept_hidden_layer"]
        self.weights = ThinkerWeights(model, [ThinkerWeights.EMBED])
        self.speakers = talker["speaker_id"]
        self.media_ids = (thinker["audio_token_id"], thinker["image_token_id"], thinker["video_token_id"])
        self.markers = [config["tts_bos_token_id"], config["tts_eos_token_id"], config["tts_pad_token_id"]]
        self.end_ids: set[int] = set()

    def speaker(self, name: str | None) -> str:
        """The checkpoint's speaker `name` (or its first; names are lower case); unknown: a MediaError."""
        return qwen2_5_omni.choose_speaker(self.speakers, name and name.lower(), self.family)

    def conditioning(
        self, prompt_ids: list[int], generated: list[int], hidden: Any, speaker: str
    ) -> dict[str, np.ndarray]:
        """The talker's conditioning from the saved layer's rows at the positions fed."""
        import torch

        weights = self.weights
        return qwen3_omni.talker_conditioning(
            torch.tensor(prompt_ids),
            generated,
            weights.embed(prompt_ids + generated[:-1]),
            hidden,
            weights.embed(self.markers),
            media_ids=self.media_ids,
            end_ids=self.end_ids,
            speaker_id=self.speakers[speaker],
        )


class ThinkerReadout(Protocol):
    """How one family's thinker hidden states, as vLLM saves them, become its talker's conditioning."""

    layer: int  # the layer vLLM captures (`eagle_aux_hidden_state_layer_ids`)
    end_ids: set[int]  # ids that end the thinker's text, set once the engine's tokenizer is loaded

    def speaker(self, name: str | None) -> str: ...

    def conditioning(
        self, prompt_ids: list[int], generated: list[int], hidden: Any, speaker: str
    ) -> dict[str, np.ndarray]: ...


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
