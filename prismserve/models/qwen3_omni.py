"""Qwen3-Omni (MoE thinker): image and audio encoders and the thinker, split like Qwen2.5-Omni.

What differs from Qwen2.5-Omni at the split: the vision encoder also returns DeepStack features
(the merged patches of some of its layers, added to the thinker's first layers' hidden states at
the image positions). An image's encoding is therefore `[1 + levels, tokens, hidden]`: the
embeddings, then one row per DeepStack level; the thinker gets them through `mm_encoder_outputs`.

Speech: the talker gets the thinker's input embeddings and the hidden states of one of its layers
(`accept_hidden_layer`) over prompt and reply, and builds its prompt as transformers' `generate`
does (user turns: media positions from hidden states, text from embeddings; the reply fed one
position per step). Each step yields a frame: the talker's codebook-0 id and the code predictor's
ids for the other codebooks. code2wav turns frames into 24 kHz audio, deterministically. Concurrent
requests' talkers decode together in `HFEngine` (`Qwen3TalkerModel`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np

from prismserve.models.base import (
    Encoded,
    EngineModel,
    MediaError,
    Playout,
    VocoderStream,
    as_numpy,
    qwen_vllm_embeddings,
)
from prismserve.models.conditioning import FILL, REPLY, ConditioningBuilder, Item
from prismserve.models.qwen2_5_omni import SAMPLE_RATE_OUT, Qwen25Omni, Slot, talker_positions


class Qwen3Conditioning(ConditioningBuilder):
    """Qwen3-Omni's talker conditioning, from the thinker's input embeddings and the hidden states of
    the layer the talker listens to (`accept_hidden_layer`) at each position it fed. One class for
    every engine that runs the thinker (transformers, vLLM), so they agree.

    The talker reads the prompt's hidden states at its media positions and its embeddings elsewhere
    (the media rows of the embeddings are zeroed, so every engine hands over the same arrays); the
    reply is text alone: its embeddings from the assistant turn's fourth position on (the first in
    the talker's prefix, the rest one per decoding step), then the text-to-speech end marker; the
    fill is the pad marker. `markers` are the thinker's embeddings of the three markers (start,
    end, pad); the talker projects every row itself."""

    def __init__(
        self,
        prompt_ids: list[int],
        markers: Any,
        *,
        media_ids: Collection[int],
        assistant: tuple[int, int],
        speaker_id: int,
        emit: Callable[[Item], object],
        extra: Item | None = None,
    ) -> None:
        super().__init__(prompt_ids, emit, extra)
        self.markers = markers
        self.media_ids = sorted(media_ids)
        self.speaker_id = speaker_id
        self.text_start = reply_start(prompt_ids, assistant) + 3  # after "<|im_start|>assistant\n"
        self.embeds: Any = None
        self.hidden: Any = None

    def prompt_rows(self, embeds: Any, hidden: Any) -> Any:
        import torch

        media = torch.isin(torch.tensor(self.prompt_ids), torch.tensor(self.media_ids)).to(embeds.device)
        self.embeds, self.hidden = torch.where(media[:, None], 0, embeds), hidden
        return list(self.embeds[self.text_start :])

    def text_row(self, embed: Any, hidden: Any) -> Any:
        return embed

    def first_item(self, first: Any) -> Item:
        width = self.embeds.shape[-1]
        return {
            "input_ids": np.asarray(self.prompt_ids, dtype=np.int64),
            "thinker_embed": as_numpy(self.embeds),
            "thinker_hidden": as_numpy(self.hidden),
            "first_text": np.zeros((0, width), np.float32) if first is None else as_numpy(first[None]),
            "tts_embeds": as_numpy(self.markers),
            "speaker": np.asarray(self.speaker_id),
            FILL: as_numpy(self.markers[2:]),
        }

    def end_rows(self) -> Any:
        return self.markers[1:2]


def reply_start(prompt_ids: Any, assistant: tuple[int, int]) -> int:
    """Where the prompt's last assistant turn starts (its `<|im_start|>`, followed by `assistant`)."""
    pairs = [i for i in range(len(prompt_ids) - 1) if (prompt_ids[i], prompt_ids[i + 1]) == assistant]
    if not pairs:
        raise ValueError("the thinker's prompt opens no assistant turn: the talker has no reply to speak")
    return pairs[-1]


class Qwen3Omni(Qwen25Omni):
    """Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`): encoders, thinker, talker, code2wav."""

    family = "qwen3-omni"
    component_prefixes = {
        "image": ("thinker.visual.",),
        "video": ("thinker.visual.",),  # one vision tower encodes both
        "audio": ("thinker.audio_tower.",),
        "talker": ("talker.",),
        "vocoder": ("code2wav.",),
    }
    model_class = "Qwen3OmniMoeForConditionalGeneration"
    processor_class = "Qwen3OmniMoeProcessor"

    @classmethod
    def voices(cls, path: Path) -> tuple[str, ...]:
        """The speakers of the checkpoint's config (`talker_config.speaker_id`), in its order."""
        return tuple(json.loads((path / "config.json").read_text())["talker_config"]["speaker_id"])

    def visual_rows(self, out: Any) -> list[Any]:
        """Per image or clip `[1 + levels, tokens, hidden]`: its embeddings and its DeepStack features."""
        import torch

        levels = out.deepstack_features  # per level: one tensor per item
        return [
            torch.stack([main, *(level[i] for level in levels)]) for i, main in enumerate(out.pooler_output)
        ]

    def audio_token_counts(self, feature_lengths: Any) -> list[int]:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths,
        )

        config = self.model.config  # the whole model's, or the thinker's in an encoder replica
        window = getattr(config, "thinker_config", config).audio_config.n_window
        return _get_feat_extract_output_lengths(feature_lengths, window).tolist()

    def token_count(self, encoded: Encoded) -> int:
        return encoded.embeddings.shape[1] if encoded.modality != "audio" else len(encoded.embeddings)

    def soundtrack_placeholder(self, video: Slot, audio_tokens: int) -> str:
        """A video's tokens and its soundtrack's merged by time (a video token at its temporal
        position before the audio tokens from there on), between audio start and end, as the model's
        processor writes them (`Qwen3OmniMoeProcessor.replace_video_with_audio_token`)."""
        processor = self.processor
        assert video.grid is not None and video.second_per_grid is not None
        t, h, w = video.grid
        merge = processor.image_processor.merge_size
        times = np.repeat(np.arange(t), (h // merge) * (w // merge)) * video.second_per_grid
        times = times * processor.position_id_per_seconds
        # By time, a video token first where its time is the audio token's.
        keys = np.concatenate([times, np.arange(audio_tokens)])
        kinds = np.repeat([0, 1], [len(times), audio_tokens])
        marks = np.where(kinds[np.lexsort((kinds, keys))] == 0, processor.video_token, processor.audio_token)
        return processor.audio_bos_token + "".join(marks) + processor.audio_eos_token

    def vllm_embeddings(self, items: list[Encoded]) -> Any:
        """vLLM's Qwen3-Omni thinker takes an image's DeepStack levels beside its embeddings, in one
        row per token: `[1 + levels, tokens, hidden]` becomes `[tokens, (1 + levels) * hidden]`."""
        if items[0].modality != "image":
            return qwen_vllm_embeddings(items)
        widened = [
            Encoded(e.modality, e.embeddings.transpose(1, 0, 2).reshape(e.embeddings.shape[1], -1), e.meta)
            for e in items
        ]
        return qwen_vllm_embeddings(widened)

    def place_visual(self, inputs: dict[str, Any], embeds: Any, items: list[Encoded]) -> Any:
        import torch
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            BaseModelOutputWithDeepstackFeatures,
        )

        stacks = [
            torch.tensor(np.asarray(e.embeddings)).to(self.device, embeds.dtype) for e in items
        ]  # copies
        # transformers annotates these as tensors; the thinker takes a tuple of them, one per item.
        inputs.setdefault("mm_encoder_outputs", {})[items[0].modality] = BaseModelOutputWithDeepstackFeatures(
            pooler_output=tuple(s[0] for s in stacks),  # type: ignore[arg-type]
            deepstack_features=[
                tuple(s[level] for s in stacks)  # type: ignore[misc]
                for level in range(1, stacks[0].shape[0])
            ],
        )
        return embeds  # the thinker places them (and adds the DeepStack rows in its first layers)

    # --- speech: the talker (with its code predictor) and code2wav ------------------------------
    def _load(self, with_talker: bool) -> Any:
        model = super()._load(with_talker)
        if with_talker and not hasattr(model.talker.config, "audio_config"):
            # transformers 5.2x: the talker's 3-D positions read the audio encoder's window from its
            # own config, which has none (audio in, speech out fails); it is the thinker's.
            model.talker.config.audio_config = model.config.thinker_config.audio_config
        return model

    def speaker(self, name: str | None) -> str:
        speakers = self.model.config.talker_config.speaker_id
        if name is None:
            return next(iter(speakers))
        if name.lower() not in speakers:
            raise MediaError(f"{self.family} has no speaker {name!r}; it has {sorted(speakers)}")
        return name.lower()

    def conditioning(
        self, inputs: dict[str, Any], speaker: str, emit: Callable[[Item], object]
    ) -> ConditioningBuilder:
        """The builder of one request's talker conditioning: the thinker's input embeddings and the
        hidden states of the layer the talker listens to, over prompt and reply, and its embeddings
        of the three text-to-speech markers (the talker projects them itself)."""
        import torch

        config = self.model.config
        ids = inputs["input_ids"]
        markers = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
        thinker = config.thinker_config
        return Qwen3Conditioning(
            ids[0].tolist(),
            self.model.thinker.get_input_embeddings()(torch.tensor(markers, device=ids.device)),
            media_ids=(thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id),
            assistant=(config.im_start_token_id, config.assistant_token_id),
            speaker_id=config.talker_config.speaker_id[speaker],
            emit=emit,
            extra=self.media_positions(inputs),
        )

    def talker_states(self, states: Any) -> tuple[Any, Any]:
        return states[0][0], states[self.model.config.talker_config.accept_hidden_layer][0]

    def load_talker(self) -> None:
        model = self._load(with_talker=True)
        del model.thinker, model.code2wav
        self.model = model

    def talker_prompt(self, conditioning: Item) -> dict[str, Any]:
        """The talker's prompt from the thinker's conditioning (its first item, or all of it merged),
        as transformers' `generate` builds it: the user turns (media positions from the thinker's
        hidden states, text from its embeddings) and the assistant turn's first tokens with the
        speaker's and codec markers as `inputs_embeds`; the rest of the reply (`trailing_text_hidden`:
        the rows known so far, the whole reply when `conditioning` is complete) fed one position per
        step, then `tts_pad_embed`; the ids the 3-D positions are computed from."""
        import torch

        model, config = self.model, self.model.config
        talker, media_config = model.talker, config.thinker_config

        def tensor(name: str) -> Any:
            return torch.tensor(
                np.asarray(conditioning[name]), device=self.device
            )  # a copy: inputs may be read-only views

        ids = tensor("input_ids")[None]
        embed = tensor("thinker_embed")[None].to(talker.dtype)
        hidden = tensor("thinker_hidden")[None].to(talker.dtype)
        media_ids = [media_config.audio_token_id, media_config.image_token_id, media_config.video_token_id]
        media = torch.isin(ids, torch.tensor(media_ids, device=self.device))
        length = ids.shape[1]
        with torch.inference_mode():
            # The user turns, in order: media positions from the thinker's hidden states, text from its embeddings.
            positions = torch.arange(length, device=self.device)[None]
            starts = torch.cummax(torch.where(ids == config.im_start_token_id, positions, -1), -1).values
            user = ids.gather(1, (starts.clamp_min(0) + 1).clamp_max(length - 1)) == config.user_token_id
            order = torch.where(user, length + positions, positions).argsort(-1)[:, -int(user.sum()) :]
            user_embeds = model._get_talker_user_parts(0, length, media, hidden, embed)
            user_embeds = user_embeds.gather(1, order[..., None].expand(-1, -1, user_embeds.shape[-1]))
            # The assistant turn: its first tokens (to the first text) with the speaker and codec
            # markers; the rest of the reply is fed one position per generated frame.
            start = reply_start(
                conditioning["input_ids"].tolist(), (config.im_start_token_id, config.assistant_token_id)
            )
            turn = torch.cat([embed[:, : start + 3], tensor("first_text")[None].to(talker.dtype)], dim=1)
            bos, end, pad = talker.text_projection(tensor("tts_embeds")[None].to(talker.dtype)).chunk(
                3, dim=1
            )
            assistant_embeds, assistant_ids, _ = model._get_talker_assistant_parts(
                start, turn.shape[1], int(conditioning["speaker"]), turn, pad, bos, end
            )
            inputs_embeds = torch.cat([user_embeds, assistant_embeds], dim=1)
            prompt = {
                "inputs_embeds": inputs_embeds,
                "trailing_text_hidden": talker.text_projection(tensor(REPLY)[None].to(talker.dtype)),
                "tts_pad_embed": pad,
                "talker_input_ids": torch.cat([ids.gather(1, order), assistant_ids], dim=1),
                "attention_mask": torch.ones(inputs_embeds.shape[:2], dtype=torch.long, device=self.device),
            }
        return prompt | talker_positions(conditioning, tensor)

    def reply_rows(self, rows: np.ndarray) -> list[Any]:
        """Reply rows (the thinker's embeddings) as the talker is fed them: projected, one tensor each."""
        import torch

        talker = self.model.talker
        with torch.inference_mode():
            return list(
                talker.text_projection(torch.tensor(np.asarray(rows), device=self.device).to(talker.dtype))
            )

    def talker_sampling(self, temperature: float) -> dict[str, Any]:
        """How the talker samples (transformers' Qwen3-Omni defaults): greedy at temperature 0, a
        repetition penalty of 1.05, and the top 1024 ids (control codes) suppressed but the end token."""
        config = self.model.config.talker_config
        vocab, eos = config.text_config.vocab_size, config.codec_eos_token_id
        sampling = (
            {"do_sample": False}
            if temperature <= 0
            else {"do_sample": True, "temperature": temperature, "top_k": 50}
        )
        suppressed = [i for i in range(vocab - 1024, vocab) if i != eos]
        return {"repetition_penalty": 1.05, "suppress_tokens": suppressed, **sampling}

    def talk(
        self,
        conditioning: dict[str, np.ndarray],
        max_codes: int,
        *,
        temperature: float = 0.0,
        on_code: Callable[[Any], None] | None = None,
    ) -> list[Any]:
        """Codec frames (one id per codebook) for the thinker's output from transformers' own
        `generate`, one request at a time; `on_code` sees each frame as the code predictor completes
        it. Serving batches through `talker_model`; this is its reference."""
        import torch

        talker = self.model.talker
        frames: list[list[int]] = []

        def frame(module: Any, args: Any, out: Any) -> None:
            # A decoding step's forward carries the frame of the token before, completed by the code predictor.
            if out.hidden_states[-1] is not None:
                frames.append(out.hidden_states[-1][0].tolist())
                if on_code is not None:
                    on_code(frames[-1])

        prompt = self.talker_prompt(conditioning)
        with self.lock, torch.inference_mode():
            hook = talker.register_forward_hook(frame)
            try:
                talker.generate(
                    **prompt,
                    **self.talker_sampling(temperature),
                    max_new_tokens=max_codes,
                    eos_token_id=self.model.config.talker_config.codec_eos_token_id,
                    output_hidden_states=True,
                    return_dict_in_generate=True,
                )
            finally:
                hook.remove()
        return frames

    def talker_model(self) -> EngineModel:
        """The talker (with its code predictor) as the batching engine runs it."""
        return Qwen3TalkerModel(self)

    def until_end(self, codes: list[Any]) -> list[Any]:
        return codes  # frames stop where the talker stopped: its end token gets no frame

    def load_vocoder(self) -> None:
        model = self._load(with_talker=True)
        del model.thinker, model.talker
        self.model = model

    def vocode(self, codes: list[Any], speaker: str, seed: int = 0) -> np.ndarray:
        """24 kHz float32 audio for codec frames, decoded as transformers decodes them (chunks of 300
        frames with 25 of left context); deterministic (`speaker` and `seed` play no part)."""
        import torch

        frames = torch.tensor(codes, device=self.device).T[None]  # [1, codebooks, frames]
        with self.lock, torch.inference_mode():
            wav = self.model.code2wav.chunked_decode(
                frames, chunk_size=Code2WavStream.REFERENCE_CHUNK, left_context_size=Code2WavStream.CONTEXT
            )
        return wav.reshape(-1).float().cpu().numpy()

    def vocoder_stream(self, speaker: str, seed: int = 0) -> VocoderStream:
        """A streaming decode of one utterance (`speaker` and `seed` play no part, as in `vocode`);
        concurrent streams decode their chunks in batches (`vocoder_batcher`)."""
        return Code2WavStream(self)

    def _vocoder_batch(self, key: Any, items: list[Any]) -> list[Any]:
        """Code2wav on several streams' chunks of one length (`key`), each `[codebooks, frames]`."""
        import torch

        with self.lock, torch.inference_mode():
            return list(self.model.code2wav(torch.stack(items)).reshape(len(items), -1))

    def generate_options(self, args: dict[str, Any], audio: bool) -> dict[str, Any]:
        return {**args, "thinker_eos_token_id": sorted(self.eos_token_ids()), "return_audio": audio}


class Qwen3TalkerModel(EngineModel):
    """Qwen3-Omni's talker in the batching engine, every row's step built as its `generate` builds it
    for one request, for all rows at once: the code predictor completes each row's last frame (in:
    the talker's last-layer state at the row's last position and its codebook-0 id's embedding; out:
    the other codebooks' ids), one generation for the batch; a row's next input is the sum of that
    frame's codebook embeddings plus its own reply text at its own step (the pad embedding once the
    text is spent). Requests stream frames, each one step after its codebook-0 id; the last id (the
    end token, or the one at `max_codes`) gets none, as under `generate`."""

    keeps_hidden = True

    def __init__(self, adapter: Qwen3Omni) -> None:
        talker = adapter.model.talker
        super().__init__(talker, {talker.config.codec_eos_token_id})
        self.adapter = adapter
        self.groups = talker.config.num_code_groups

    def position_offset(self) -> int:
        # The talker keeps its M-RoPE deltas on itself; `generate` decodes at the cache length plus them.
        deltas = self.module.rope_deltas
        return 0 if deltas is None else int(deltas.reshape(-1)[0])

    def generation_config(self, sampling: Any) -> Any:
        config = super().generation_config(sampling)
        config.update(**self.adapter.talker_sampling(sampling.temperature or 0.0))
        return config

    def last_hidden(self, hidden_states: Any) -> Any:
        return hidden_states[0][-1][:, -1]  # the talker returns (its layers' states, residual codes)

    def stream(self, sequence: Any, token: int) -> None:
        pass  # its frame is streamed once the code predictor completes it, at the row's next step

    def step_inputs(self, rows: list[Any], ids: Any) -> dict[str, Any]:
        import torch

        first = self.module.get_input_embeddings()(ids)  # [rows, 1, hidden]
        residuals, embeds = self._residuals(rows, first)
        for row, frame in zip(rows, torch.cat([ids, residuals], dim=1).tolist(), strict=True):
            row.emit(frame)
        text = torch.stack([row.feed.at(len(row.tokens) - 1) for row in rows])[:, None]
        # `generation_step` only counts steps for `generate` (the talker's forward returns it plus
        # one); each row here is fed its own text above.
        return {
            "inputs_embeds": torch.cat([first, embeds], dim=1).sum(1, keepdim=True) + text,
            "generation_step": 0,
        }

    def _residuals(self, rows: list[Any], first: Any) -> tuple[Any, Any]:
        """Every row's ids (`[rows, groups - 1]`) and embeddings (`[rows, groups - 1, hidden]`) for
        the codebooks after the first: greedy rows and sampled ones are generated apart, as
        transformers gives the code predictor the talker's `do_sample` (sampled ones draw from torch's
        global generator, as under `generate`: a request's seed fixes its codebook-0 ids only)."""
        import torch

        prompt = torch.cat([torch.cat([row.last_hidden for row in rows])[:, None], first], dim=1)
        ids = torch.empty(len(rows), self.groups - 1, dtype=torch.long, device=first.device)
        embeds = first.new_empty(len(rows), self.groups - 1, first.shape[-1])
        for sampled in (False, True):
            index = [i for i, row in enumerate(rows) if ((row.sampling.temperature or 0.0) > 0) == sampled]
            if index:
                ids[index], embeds[index] = self._predict(prompt[index], sampled)
        return ids, embeds

    def _predict(self, prompt: Any, sampled: bool) -> tuple[Any, Any]:
        """The code predictor's generation for `prompt` (`[rows, 2, hidden]`: each row's last state
        and codebook-0 embedding), with the embeddings of the ids it chose, as the talker's
        `prepare_inputs_for_generation` runs it."""
        import torch

        predictor = self.module.code_predictor
        options = {"do_sample": True, "top_k": 50, "top_p": 0.8} if sampled else {"do_sample": False}
        out = predictor.generate(
            inputs_embeds=prompt,
            max_new_tokens=self.groups - 1,
            output_hidden_states=True,
            return_dict_in_generate=True,
            **options,
        )
        middle = [step[0] for step in out.hidden_states[1:]]  # each step's input: the id before it
        last = predictor.get_input_embeddings()[-1](out.sequences[:, -1:])
        return out.sequences, torch.cat([*middle, last], dim=1)


class Code2WavStream:
    """Code2wav decoding an utterance while its frames arrive: every `CHUNK` frames are decoded with
    the `CONTEXT` frames before them, transformers' `chunked_decode` scheme in chunks small enough to
    stream (frames that piled up while the vocoder was busy decode together, in one call). Code2wav is causal, but its transposed convolutions leave the last samples of a decode
    unfinished until later frames come: within one of `chunked_decode`'s chunks of `REFERENCE_CHUNK`
    frames they wait for the next small chunk; at the end of one they are dropped, as
    `chunked_decode` drops them, so the stream has the length of `Qwen3Omni.vocode`'s audio (and, for
    an utterance of at most `CHUNK` frames, exactly its samples)."""

    CHUNK = 25  # frames per decoded chunk: two seconds of audio at 12.5 frames a second
    CONTEXT = 25
    REFERENCE_CHUNK = 300  # `chunked_decode`'s chunk, as `Qwen3Omni.vocode` calls it

    def __init__(self, adapter: Qwen3Omni) -> None:
        self.adapter = adapter
        self.code2wav = adapter.model.code2wav
        self.frames: list[Any] = []
        self.decoded = 0  # frames decoded so far
        self.sent = 0  # audio samples handed out so far
        self.playout = Playout(SAMPLE_RATE_OUT)  # when the listener needs more: the batcher's deadline

    def push(self, frames: list[Any]) -> np.ndarray:
        """Audio that these frames complete (whole chunks of them)."""
        self.frames.extend(frames)
        end = self.decoded + (len(self.frames) - self.decoded) // self.CHUNK * self.CHUNK
        return self._hand_out(self._decode(end))

    def finish(self) -> np.ndarray:
        """The rest of the utterance's audio."""
        return self._hand_out(self._decode(len(self.frames)))

    def _hand_out(self, audio: np.ndarray) -> np.ndarray:
        self.playout.handed_out(len(audio))
        return audio

    def _decode(self, end: int) -> np.ndarray:
        import torch

        wavs = []
        upsample = self.code2wav.total_upsample
        while self.decoded < end:
            # The first chunk alone (time to first audio); then all that is ready, up to the next of
            # `chunked_decode`'s chunk boundaries: frames that piled up decode in one call.
            boundary = (self.decoded // self.REFERENCE_CHUNK + 1) * self.REFERENCE_CHUNK
            stop = min(end, boundary if self.decoded else self.CHUNK)
            first = max(0, self.decoded - self.CONTEXT)
            codes = torch.tensor(self.frames[first:stop], device=self.adapter.device).T  # [codebooks, frames]
            # Samples from first * upsample on.
            wav = self.adapter.vocoder_batcher(codes.shape[1], codes, self.playout.deadline())
            wavs.append(wav[self.sent - first * upsample :])
            self.sent = first * upsample + len(wav)
            if stop % self.REFERENCE_CHUNK == 0:
                self.sent = stop * upsample  # the unfinished samples chunked_decode drops
            self.decoded = stop
        return torch.cat(wavs).float().cpu().numpy() if wavs else np.zeros(0, dtype=np.float32)
