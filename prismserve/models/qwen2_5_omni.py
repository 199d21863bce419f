"""Qwen2.5-Omni: image, video and audio encoders, a thinker LLM, a talker and token2wav (DiT + BigVGAN).

Split points and what crosses them:
- encoders -> thinker: image and video embeddings + `grid_thw` (a video's also the seconds per
  temporal patch); audio embeddings + the clip's mel-feature length (the thinker's 3-D rotary
  positions need them). The thinker is fed `inputs_embeds` with the embeddings in place of the media
  tokens, so it runs exactly the monolith's computation. A video whose soundtrack goes in too
  (`use_audio_in_video`) is followed by that soundtrack's audio embeddings; the thinker lays the two
  out interleaved in 2-second chunks, as the model's processor does (`soundtrack_placeholder`).
- thinker -> talker: the talker's conditioning, built as transformers' `generate` builds it: per
  position the thinker's input embedding plus last hidden state (media positions zeroed), the
  speaker's text-start embedding, and the reply part (generated tokens, then text end and pad),
  streamed while the thinker generates (`Qwen25Conditioning`).
- talker -> token2wav: codec ids; token2wav turns them into 24 kHz audio with the speaker's
  conditioning and reference mel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from prismserve.models.base import (
    Adapter,
    Encoded,
    EngineModel,
    MediaError,
    MediaInput,
    Playout,
    ThreadBatcher,
    VocoderStream,
    as_numpy,
    build_processor,
    load_pretrained,
    qwen_vllm_embeddings,
    token_streamer,
)
from prismserve.models.conditioning import FILL, REPLY, ConditioningBuilder, Item, ReplyFeed, merged
from prismserve.models.media import load_audio, load_image
from prismserve.models.qwen2_5_vl import qwen_video_pixels

SAMPLE_RATE_IN = 16000
SAMPLE_RATE_OUT = 24000


TALKER_POSITIONS = ("image_grid_thw", "video_grid_thw", "video_second_per_grid")
"""The thinker's inputs the talker's 3-D positions read as they are."""


def talker_positions(conditioning: Item, tensor: Callable[[str], Any]) -> dict[str, Any]:
    """The talker's inputs that place the prompt's media (`media_positions`, as the conditioning
    carries them), each named field made a tensor by `tensor`."""
    out = {
        name: tensor(name) for name in (*TALKER_POSITIONS, "audio_feature_lengths") if name in conditioning
    }
    if "use_audio_in_video" in conditioning:
        out["use_audio_in_video"] = bool(conditioning["use_audio_in_video"])
    return out


@dataclass(frozen=True)
class Slot:
    """A media item's place in the thinker's prompt: its placeholder tokens, and a video's grid and
    seconds per temporal patch (its soundtrack's tokens interleave by them)."""

    modality: str
    tokens: int
    grid: list[int] | None = None
    second_per_grid: float | None = None


def _soundtracks(conversation: list[dict[str, Any]]) -> bool:
    """Whether the conversation's videos are each followed by their soundtrack (`use_audio_in_video`:
    `tasklib.conversation` marks their placeholders and puts the soundtrack after each)."""
    parts = [part for message in conversation if isinstance(c := message.get("content"), list) for part in c]
    return any(isinstance(part, dict) and part.get("audio_in_video") for part in parts)


@dataclass(frozen=True)
class TalkerTokens:
    """The token ids the talker's conditioning is built with: the thinker's media placeholders (their
    embeddings are hidden from the talker) and the talker's text end and pad tokens."""

    media: tuple[int, ...]
    text_end: int
    text_pad: int

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> TalkerTokens:
        """From a checkpoint's configuration (its config.json, as a dict)."""
        thinker, talker = config["thinker_config"], config["talker_config"]
        media = ("audio_token_index", "image_token_index", "video_token_index")
        return cls(
            media=tuple(thinker[key] for key in media),
            text_end=talker["tts_text_end_token_id"],
            text_pad=talker["tts_text_pad_token_id"],
        )


class Qwen25Conditioning(ConditioningBuilder):
    """Qwen2.5-Omni's talker conditioning, built as transformers' `generate` builds it, from the
    thinker's input embedding and last hidden state (after the final norm) at each position it fed;
    `embed` looks token ids up in the thinker's embedding table (`[n, hidden]`). One class for every
    engine that runs the thinker (transformers, vLLM), so they agree.

    Per position the talker gets the sum of the two (media embeddings zeroed): the prompt's and
    the first reply token's in its prefix (between them the speaker's start), then one reply
    position per decoding step; the reply's last token (never fed) becomes the text end, the fill
    is the text pad."""

    def __init__(
        self,
        prompt_ids: list[int],
        embed: Callable[[list[int]], Any],
        *,
        speaker_bos: int,
        tokens: TalkerTokens,
        emit: Callable[[Item], object],
        extra: Item | None = None,
    ) -> None:
        super().__init__(prompt_ids, emit, extra)
        self.embed = embed
        self.speaker_bos = speaker_bos
        self.tokens = tokens
        self.prompt: Any = None

    def prompt_rows(self, embeds: Any, hidden: Any) -> list[Any]:
        import torch

        media = torch.isin(
            torch.tensor(self.prompt_ids, device=embeds.device),
            torch.tensor(self.tokens.media, device=embeds.device),
        )
        self.prompt = hidden + torch.where(media[:, None], 0, embeds)  # the talker does not see the media
        return []

    def text_row(self, embed: Any, hidden: Any) -> Any:
        return hidden + embed

    def first_item(self, first: Any) -> Item:
        import torch

        reply = [] if first is None else [first[None]]
        prefix = torch.cat([self.prompt, self.embed([self.speaker_bos]), *reply])
        return {
            "input_ids": np.asarray(self.prompt_ids, dtype=np.int64),
            "text_ids": np.asarray([*self.prompt_ids, self.speaker_bos, *self.generated[:1]], dtype=np.int64),
            "prefix_embeds": as_numpy(prefix),
            FILL: as_numpy(self.embed([self.tokens.text_pad])),
        }

    def end_rows(self) -> Any:
        # The text end takes the place of the last token, which was generated and never fed; a
        # reply of one token has no text row, and no end either (as transformers builds it).
        return [] if len(self.generated) < 2 else self.embed([self.tokens.text_end])


def choose_speaker(speakers: Mapping[str, Any], name: str | None, family: str) -> str:
    """A speaker of the checkpoint's speaker map (`name`, or its first); an unknown one is a MediaError."""
    if name is None:
        return next(iter(speakers))
    if name not in speakers:
        raise MediaError(f"{family} has no speaker {name!r}; it has {sorted(speakers)}")
    return name


class Qwen25Omni(Adapter):
    """Qwen2.5-Omni (`Qwen2_5OmniForConditionalGeneration`)."""

    family = "qwen2.5-omni"
    component_prefixes = {
        "image": ("thinker.visual.",),
        "video": ("thinker.visual.",),  # one vision tower encodes both
        "audio": ("thinker.audio_tower.",),
        "talker": ("talker.",),
        "vocoder": ("token2wav.",),
    }
    encoder_modalities: ClassVar[tuple[str, ...]] = ("image", "audio", "video")

    model_class = "Qwen2_5OmniForConditionalGeneration"
    processor_class = "Qwen2_5OmniProcessor"

    @classmethod
    def voices(cls, path: Path) -> tuple[str, ...]:
        """The speakers of the checkpoint's `spk_dict.pt` (Chelsie, Ethan), in its order."""
        import torch

        return tuple(torch.load(path / "spk_dict.pt", weights_only=True))

    @cached_property
    def processor(self) -> Any:
        import transformers

        extractor = transformers.WhisperFeatureExtractor.from_pretrained(self.path)
        return build_processor(
            getattr(transformers, self.processor_class), self.path, feature_extractor=extractor
        )

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def _load(self, with_talker: bool) -> Any:
        import transformers

        # Without the talker the model is built without it and its vocoder: their weights stay unread.
        speech = {} if with_talker else {"enable_audio_output": False}
        return load_pretrained(
            getattr(transformers, self.model_class), self.path, self.device, self.dtype, **speech
        )

    def llm(self) -> Any:
        return self.model.thinker

    # --- encoders -------------------------------------------------------------------------------
    def load_encoder(self, modality: str) -> None:
        self.check_modality(modality)
        thinker = self._load(with_talker=False).thinker.model
        # Keep the one tower this replica runs (and the module whose feature methods drive it).
        del thinker.language_model
        if modality == "audio":
            del thinker.visual
        else:
            del thinker.audio_tower
        self.model = thinker
        self.processor  # noqa: B018 - loaded now rather than on the first request

    def encode(self, modality: str, items: list[bytes]) -> list[Encoded]:
        import torch

        self.check_modality(modality)
        if modality != "audio":
            return self._encode_visual(modality, items)
        features = self.audio_features([load_audio(d, SAMPLE_RATE_IN) for d in items])
        mask = features["feature_attention_mask"].to(self.device)
        with self.lock, torch.inference_mode():
            merged = self.model.get_audio_features(
                features["input_features"].to(self.device), mask
            ).last_hidden_state
        lengths = mask.sum(-1)
        parts = torch.split(merged, self.audio_token_counts(lengths))
        return [
            Encoded("audio", as_numpy(p), {"feature_length": int(n)})
            for p, n in zip(parts, lengths, strict=True)
        ]

    def _encode_visual(self, modality: str, items: list[bytes]) -> list[Encoded]:
        """Images or video clips through the vision tower: embeddings, `grid_thw` and (a clip's)
        seconds per temporal patch."""
        import torch

        if modality == "image":
            pixels = self.image_pixels([load_image(d) for d in items])
            values, grids = pixels["pixel_values"], pixels["image_grid_thw"]
            features = self.model.get_image_features
        else:
            pixels = self.video_pixels(items)
            values, grids = pixels["pixel_values_videos"], pixels["video_grid_thw"]
            features = self.model.get_video_features
        with self.lock, torch.inference_mode():
            parts = self.visual_rows(features(values.to(self.device), grids.to(self.device)))
        metas = [{"grid_thw": g.tolist()} for g in grids]
        for meta, seconds in zip(metas, pixels.get("video_second_per_grid", []), strict=False):
            meta["second_per_grid"] = float(seconds)
        return [Encoded(modality, as_numpy(p), m) for p, m in zip(parts, metas, strict=True)]

    def visual_rows(self, out: Any) -> list[Any]:
        """Per image or clip, what of the vision tower's output crosses to the thinker: its embeddings."""
        return list(out.pooler_output)

    # --- thinker --------------------------------------------------------------------------------
    def load_llm(self, with_encoders: bool) -> None:
        self.model = self._load(with_talker=False)
        if not with_encoders:
            del self.model.thinker.model.visual, self.model.thinker.model.audio_tower
        self.processor  # noqa: B018

    def llm_inputs(
        self,
        conversation: list[dict[str, Any]],
        encoded: list[Encoded] | None = None,
        media: list[MediaInput] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        text = self.processor.apply_chat_template(
            conversation, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        soundtracks = _soundtracks(conversation)
        if media:
            return self._raw_inputs(text, media, soundtracks)
        if not encoded:
            return dict(self.processor(text=[text], return_tensors="pt").to(self.device))
        return self._embedded_inputs(text, encoded, soundtracks)

    def _raw_inputs(self, text: str, media: list[MediaInput], soundtracks: bool = False) -> dict[str, Any]:
        unsupported = sorted({m.modality for m in media} - set(self.encoder_modalities))
        if unsupported:
            raise MediaError(
                f"{self.family} takes {', '.join(self.encoder_modalities)} input, not {unsupported}"
            )
        if any(m.modality == "video" for m in media):
            return self.built_inputs(text, media, soundtracks)
        images = [load_image(m.data) for m in media if m.modality == "image"]
        clips = [load_audio(m.data, SAMPLE_RATE_IN) for m in media if m.modality == "audio"]
        try:
            inputs = self.processor(
                text=[text], images=images or None, audio=clips or None, return_tensors="pt"
            )
        except ValueError as exc:
            raise MediaError(f"media cannot be processed: {exc}") from None
        return dict(inputs.to(self.device))

    def built_inputs(self, text: str, media: list[MediaInput], soundtracks: bool = False) -> dict[str, Any]:
        """The model's inputs for raw media as its processor makes them, built here: the processor
        takes no video without its video processor, which needs torchvision (it does not import
        beside the CPU torch). `soundtracks`: each video is followed by its soundtrack."""
        import torch

        inputs: dict[str, Any] = {}
        images = [load_image(m.data) for m in media if m.modality == "image"]
        if images:
            inputs |= self.image_pixels(images)
        videos = [m.data for m in media if m.modality == "video"]
        if videos:
            inputs |= self.video_pixels(videos)
        clips = [load_audio(m.data, SAMPLE_RATE_IN) for m in media if m.modality == "audio"]
        if clips:
            inputs |= self.audio_features(clips)
        merge = self.processor.image_processor.merge_size**2
        none = torch.zeros(0, 3, dtype=torch.long)
        sizes = {
            "image": iter((inputs.get("image_grid_thw", none).prod(-1) // merge).tolist()),
            "video": iter((inputs.get("video_grid_thw", none).prod(-1) // merge).tolist()),
            "audio": iter(self.audio_token_counts(inputs.get("feature_attention_mask", none).sum(-1))),
        }
        grids, seconds = (
            iter(inputs.get("video_grid_thw", none).tolist()),
            iter(inputs.get("video_second_per_grid", [])),
        )
        items = [
            Slot(m.modality, next(sizes[m.modality]))
            if m.modality != "video"
            else Slot("video", next(sizes["video"]), next(grids), float(next(seconds)))
            for m in media
        ]
        ids = self.tokenizer([self._expanded(text, items, soundtracks)], return_tensors="pt")["input_ids"]
        inputs |= {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        if soundtracks:
            inputs["use_audio_in_video"] = True
        return inputs

    def _embedded_inputs(
        self, text: str, encoded: list[Encoded], soundtracks: bool = False
    ) -> dict[str, Any]:
        import torch

        items = [
            Slot(e.modality, self.token_count(e), e.meta.get("grid_thw"), e.meta.get("second_per_grid"))
            for e in encoded
        ]
        expanded = self._expanded(text, items, soundtracks)
        ids = self.tokenizer([expanded], return_tensors="pt")["input_ids"].to(self.device)
        thinker = self.model.thinker
        with torch.inference_mode():
            embeds = thinker.get_input_embeddings()(ids)
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        for modality in ("image", "video"):
            visual = [e for e in encoded if e.modality == modality]
            if visual:
                embeds = self.place_visual(inputs, embeds, visual)
        clips = [torch.tensor(np.asarray(e.embeddings)) for e in encoded if e.modality == "audio"]  # copies
        if clips:
            mask = (ids == self.processor.audio_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(mask, torch.cat(clips).to(self.device, embeds.dtype))
        grids = [e.meta["grid_thw"] for e in encoded if e.modality == "image"]
        if grids:
            inputs["image_grid_thw"] = torch.tensor(grids, device=self.device)
        videos = [i for i in items if i.modality == "video"]
        if videos:
            inputs["video_grid_thw"] = torch.tensor([v.grid for v in videos], device=self.device)
            inputs["video_second_per_grid"] = torch.tensor(
                [v.second_per_grid for v in videos], device=self.device
            )
        lengths = [e.meta["feature_length"] for e in encoded if e.modality == "audio"]
        if lengths:  # the positions of audio tokens come from the clips' feature lengths
            frames = torch.arange(max(lengths), device=self.device)
            inputs["feature_attention_mask"] = (
                frames < torch.tensor(lengths, device=self.device)[:, None]
            ).long()
        if soundtracks:
            inputs["use_audio_in_video"] = True
        inputs["inputs_embeds"] = embeds
        return inputs

    def _expanded(self, text: str, items: list[Slot], soundtracks: bool) -> str:
        """`text` with each media token replaced by its item's placeholder tokens, in order; with
        `soundtracks` a video and the soundtrack after it take its token together, interleaved."""
        tokens = {
            "image": self.processor.image_token,
            "audio": self.processor.audio_token,
            "video": self.processor.video_token,
        }
        pieces, order = [], []
        rest = text
        while True:  # split at each media token, in the conversation's order
            found = [(rest.find(t), m) for m, t in tokens.items() if rest.find(t) >= 0]
            if not found:
                break
            at, modality = min(found)
            pieces.append(rest[:at])
            order += [modality, "audio"] if modality == "video" and soundtracks else [modality]
            rest = rest[at + len(tokens[modality]) :]
        if order != [i.modality for i in items]:
            raise MediaError(
                f"the conversation's media are {order} but the ones given are {[i.modality for i in items]}"
            )
        expanded, slots = [], iter(items)
        for piece, item in zip(pieces, slots, strict=False):
            if item.modality == "video" and soundtracks:
                expanded.append(piece + self.soundtrack_placeholder(item, next(slots).tokens))
            else:
                expanded.append(piece + tokens[item.modality] * item.tokens)
        return "".join(expanded) + rest

    def soundtrack_placeholder(self, video: Slot, audio_tokens: int) -> str:
        """A video's tokens and its soundtrack's interleaved chunk by chunk (2 s each: the video's
        tokens of that time, then the audio's), between audio start and end, as the model's
        processor writes them (`Qwen2_5OmniProcessor.replace_video_with_audio_token`)."""
        processor = self.processor
        assert video.grid is not None and video.second_per_grid is not None
        t, h, w = video.grid
        merge = processor.image_processor.merge_size
        per_second = processor.position_id_per_seconds
        frames = np.repeat(np.arange(t), (h // merge) * (w // merge)) * video.second_per_grid * per_second
        chunk = int(per_second * processor.seconds_per_chunk)
        video_chunks = processor.get_chunked_index(frames, chunk)
        audio_chunks = processor.get_chunked_index(np.arange(audio_tokens), chunk)
        out = processor.audio_bos_token
        for j in range(max(len(video_chunks), len(audio_chunks))):
            if j < len(video_chunks):
                out += processor.video_token * (video_chunks[j][1] - video_chunks[j][0])
            if j < len(audio_chunks):
                out += processor.audio_token * (audio_chunks[j][1] - audio_chunks[j][0])
        return out + processor.audio_eos_token

    def audio_features(self, clips: list[Any]) -> dict[str, Any]:
        """The feature extractor's mel features of 16 kHz clips (`input_features`) and which frames
        hold each clip (`feature_attention_mask`), as the model's processor names them."""
        features = self.processor.feature_extractor(
            clips, sampling_rate=SAMPLE_RATE_IN, return_attention_mask=True, return_tensors="pt"
        )
        return {
            "input_features": features["input_features"],
            "feature_attention_mask": features["attention_mask"],
        }

    def video_pixels(self, clips: list[bytes]) -> dict[str, Any]:
        """`pixel_values_videos`, `video_grid_thw` and `video_second_per_grid` of the clips, in order."""
        # Sampled as Qwen2.5-VL's clips are: this is its vision tower.
        pixels = qwen_video_pixels(self.image_pixels, self.processor.image_processor, clips)
        pixels["video_second_per_grid"] = pixels.pop("second_per_grid_ts")
        return pixels

    def audio_token_counts(self, feature_lengths: Any) -> list[int]:
        """Embeddings the audio encoder makes of clips with these mel-feature lengths, as the
        model's processor counts them (no audio tower needed: the thinker with raw media has its own)."""
        from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

        return _get_feat_extract_output_lengths(feature_lengths).tolist()

    def image_pixels(self, images: list[Any]) -> Any:
        """The image processor's tensors; images it cannot take are a MediaError."""
        try:
            return self.processor.image_processor(images=images, return_tensors="pt")
        except ValueError as exc:
            raise MediaError(f"image cannot be processed: {exc}") from None

    def token_count(self, encoded: Encoded) -> int:
        """How many placeholder tokens an encoded item takes in the thinker's prompt."""
        return len(encoded.embeddings)

    def vllm_embeddings(self, items: list[Encoded]) -> Any:
        return qwen_vllm_embeddings(items)

    def place_visual(self, inputs: dict[str, Any], embeds: Any, items: list[Encoded]) -> Any:
        """`embeds` with the images' (or the videos') embeddings at their tokens (more inputs may be
        added to `inputs`)."""
        import torch

        token = (
            self.processor.image_token_id if items[0].modality == "image" else self.processor.video_token_id
        )
        mask = (inputs["input_ids"] == token).unsqueeze(-1)
        rows = torch.cat(
            [torch.tensor(np.asarray(e.embeddings)) for e in items]
        )  # copies: may be read-only views
        return embeds.masked_scatter(mask, rows.to(self.device, embeds.dtype))

    def speaker(self, name: str | None) -> str:
        """A speaker the checkpoint has (`name`, or its first)."""
        return choose_speaker(self.model.speaker_map, name, self.family)

    def conditioning(
        self, inputs: dict[str, Any], speaker: str, emit: Callable[[Item], object]
    ) -> ConditioningBuilder:
        """The builder of one request's talker conditioning, handing `emit` its items as the thinker
        feeds it each position's states (`talker_states`)."""
        import torch

        ids = inputs["input_ids"]
        embed = self.model.thinker.get_input_embeddings()
        return Qwen25Conditioning(
            ids[0].tolist(),
            lambda token_ids: embed(torch.tensor(token_ids, device=ids.device)),
            speaker_bos=self.model.speaker_map[speaker]["bos_token"],
            tokens=TalkerTokens.of(self.model.config.to_dict()),
            emit=emit,
            extra=self.media_positions(inputs),
        )

    def talker_states(self, states: Any) -> tuple[Any, Any]:
        """What the talker reads of one thinker forward's hidden states (transformers' tuple: input
        embeddings, each layer's output, the last normed): `[positions, hidden]` embeddings and states."""
        return states[0][0], states[-1][0]

    def talker_inputs(self, inputs: dict[str, Any], generated: Any, speaker: str) -> Item:
        """The whole talker conditioning from the thinker's prompt, output and per-step hidden states
        (`Generated.hidden_states`, as `generate(with_hidden=True)` gives them)."""
        import torch

        items: list[Item] = []
        builder = self.conditioning(inputs, speaker, items.append)
        for token in generated.token_ids:
            builder.add_token(token)
        with torch.inference_mode():
            for states in generated.hidden_states:
                builder.add_states(*self.talker_states(states))
            builder.finish()
        return merged(items)

    @staticmethod
    def media_positions(inputs: dict[str, Any]) -> Item:
        """What the talker needs to place the prompt's media (its own 3-D positions): the images' and
        videos' grids, the videos' seconds per temporal patch, the audio clips' mel-feature lengths,
        and whether the videos' soundtracks are interleaved with them."""
        out = {name: inputs[name].cpu().numpy() for name in TALKER_POSITIONS if name in inputs}
        if "feature_attention_mask" in inputs:
            out["audio_feature_lengths"] = inputs["feature_attention_mask"].sum(-1).cpu().numpy()
        if inputs.get("use_audio_in_video"):
            out["use_audio_in_video"] = np.asarray(True)
        return out

    # --- talker and token2wav -------------------------------------------------------------------
    def load_talker(self) -> None:
        """Load the talker alone."""
        model = self._load(with_talker=True)
        del model.thinker, model.token2wav
        self.model = model

    def talker_prompt(self, conditioning: Item) -> dict[str, Any]:
        """The talker's prompt from the thinker's conditioning (its first item, or all of it merged),
        as its `generate` takes it: codec ids (masks, then pad and start), the prefix embeddings,
        text ids for the 3-D positions, and the reply embeddings fed one per decoding step (the
        rows known so far, then the fill: the whole reply when `conditioning` is complete)."""
        import torch

        talker = self.model.talker

        def tensor(name: str) -> Any:
            return torch.tensor(
                np.asarray(conditioning[name]), device=self.device
            )  # a copy: inputs may be read-only views

        ids = tensor("input_ids")[None]
        codec_prompt = torch.cat(
            [
                torch.full_like(ids, talker.codec_mask_token),
                torch.tensor([[talker.codec_pad_token, talker.codec_bos_token]], device=self.device),
            ],
            dim=1,
        )
        prompt = {
            "input_ids": codec_prompt,
            "input_text_ids": tensor("text_ids")[None],
            "thinker_reply_part": torch.cat([tensor(REPLY), tensor(FILL)])[None].to(talker.dtype),
            "inputs_embeds": tensor("prefix_embeds")[None].to(talker.dtype),
            "attention_mask": torch.ones_like(codec_prompt),
        }
        return prompt | talker_positions(conditioning, tensor)

    def reply_rows(self, rows: np.ndarray) -> list[Any]:
        """Reply rows of the conditioning (`[rows, hidden]`) as the talker is fed them, one tensor each."""
        import torch

        return list(torch.tensor(np.asarray(rows), device=self.device).to(self.model.talker.dtype))

    def reply_feed(self, conditioning: Item) -> ReplyFeed:
        """The reply rows the batching engine feeds the talker, starting with those `conditioning`
        (the first item) holds; more arrive with `ReplyFeed.append`."""
        return ReplyFeed(self.reply_rows(conditioning[REPLY]), self.reply_rows(conditioning[FILL])[0])

    def talker_sampling(self, temperature: float) -> dict[str, Any]:
        """How the talker samples (transformers' Qwen2.5-Omni defaults): greedy at temperature 0."""
        talker = self.model.talker
        sampling = (
            {"do_sample": False}
            if temperature <= 0
            else {"do_sample": True, "temperature": temperature, "top_k": 40, "top_p": 0.8}
        )
        return {"suppress_tokens": [talker.codec_bos_token], "repetition_penalty": 1.05, **sampling}

    def talker_model(self) -> EngineModel:
        """The talker as the batching engine runs it (`TalkerExecutor` serves every request through it)."""
        return TalkerModel(self)

    def talk(
        self,
        conditioning: dict[str, np.ndarray],
        max_codes: int,
        *,
        temperature: float = 0.0,
        on_code: Callable[[int], None] | None = None,
    ) -> list[int]:
        """The talker's codec ids for the thinker's output from transformers' `generate`, one request
        at a time (greedy at temperature 0); `on_code` sees each id as it is generated (the end token
        included). Serving batches through `talker_model`; this is its reference."""
        import torch

        talker = self.model.talker
        prompt = self.talker_prompt(conditioning)
        with self.lock, torch.inference_mode():
            out = talker.generate(
                **prompt,
                **self.talker_sampling(temperature),
                eos_token_id=[talker.codec_pad_token, talker.codec_eos_token],
                pad_token_id=talker.codec_pad_token,
                max_new_tokens=max_codes,
                streamer=token_streamer(on_code) if on_code is not None else None,
            )
        return self.until_end(out[0, prompt["input_ids"].shape[1] :].tolist())

    def until_end(self, codes: list[int]) -> list[int]:
        """`codes` up to the talker's first end token."""
        ends = {self.model.talker.codec_pad_token, self.model.talker.codec_eos_token}
        return next((codes[:i] for i, code in enumerate(codes) if code in ends), codes)

    def load_vocoder(self) -> None:
        """Load token2wav alone (it runs in float32, as transformers runs it)."""
        model = self._load(with_talker=True)
        del model.thinker, model.talker
        model.token2wav.float()
        self.model = model

    def vocode(self, codes: list[int], speaker: str, seed: int = 0) -> np.ndarray:
        """24 kHz float32 audio for the whole utterance's `codes`, as transformers' `generate` makes it;
        `seed` fixes the diffusion's starting noise."""
        import torch

        params = self.model.speaker_map[speaker]
        with self.lock, torch.inference_mode():
            torch.manual_seed(seed)
            wav = self.model.token2wav(
                torch.tensor([codes], device=self.device),
                conditioning=params["cond"].to(self.device).float(),
                reference_mel=params["ref_mel"].to(self.device).float(),
            )
        return wav.reshape(-1).float().cpu().numpy()

    def vocoder_stream(self, speaker: str, seed: int = 0) -> VocoderStream:
        """A streaming decode of one utterance: codes in as the talker makes them, audio out per chunk.
        Concurrent streams sample and vocode their chunks in batches (`vocoder_batcher`)."""
        return Token2WavStream(self, speaker, seed)

    @cached_property
    def vocoder_batcher(self) -> ThreadBatcher:
        """Runs the vocoder streams' work in batches (`_vocoder_batch`)."""
        return ThreadBatcher(self._vocoder_batch, max_batch=8)

    def _vocoder_batch(self, key: tuple[Any, ...], items: list[Any]) -> list[Any]:
        """Token2wav for several streams at once: DiT windows (key: voice and length) or BigVGAN
        stretches (key: length)."""
        import torch

        token2wav = self.model.token2wav
        with self.lock, torch.inference_mode():
            if key[0] == "bigvgan":  # mel stretches [mel_dim, frames] -> audio [samples]
                wavs = token2wav.code2wav_bigvgan_model(torch.stack(items))
                return list(wavs.reshape(len(items), -1))
            params = self.model.speaker_map[key[1]]  # DiT windows: (codes [n], noise [frames, mel_dim])
            cond = params["cond"].to(self.device).float().expand(len(items), -1)
            ref_mel = params["ref_mel"].to(self.device).float().expand(len(items), -1, -1)
            codes, noise = (torch.stack(parts) for parts in zip(*items, strict=True))
            dit = token2wav.code2wav_dit_model
            with _speaker_encoded(dit, ref_mel):
                return list(_dit_sample(dit, cond, ref_mel, codes, noise))

    # --- the whole model ------------------------------------------------------------------------
    def load_monolith(self) -> None:
        """Everything in one process, run by transformers' own `generate` (the baseline)."""
        self.model = self._load(with_talker=True)
        self.processor  # noqa: B018

    def generate_options(self, args: dict[str, Any], audio: bool) -> dict[str, Any]:
        """The model inputs and the arguments of transformers' `generate` that differ by family."""
        talker = self.model.talker
        # Only the thinker takes pixels; the talker takes the grids.
        pixels = ("pixel_values", "pixel_values_videos")
        args = {(f"thinker_{k}" if k in pixels else k): v for k, v in args.items()}
        return {
            **args,
            "talker_eos_token_id": [talker.codec_pad_token, talker.codec_eos_token],
            "generation_mode": "audio" if audio else "text",
        }

    def generate_all(
        self,
        inputs: dict[str, Any],
        max_tokens: int,
        max_codes: int,
        speaker: str,
        *,
        seed: int = 0,
        audio: bool = True,
        on_token: Callable[[int], None] | None = None,
    ) -> tuple[list[int], np.ndarray | None]:
        """Text token ids and (with `audio`) 24 kHz audio from transformers' `generate`, greedy;
        `on_token` sees each text token as the thinker generates it."""
        import torch

        args = dict(inputs)
        if on_token is not None:
            args["thinker_streamer"] = token_streamer(on_token)
        with self.lock, torch.inference_mode():
            torch.manual_seed(seed)
            out = self.model.generate(
                **self.generate_options(args, audio),
                speaker=speaker,
                thinker_max_new_tokens=max_tokens,
                thinker_do_sample=False,
                talker_max_new_tokens=max_codes,
                talker_do_sample=False,
            )
        sequences, wav = out if audio else (getattr(out, "sequences", out), None)
        tokens = sequences[0, inputs["input_ids"].shape[1] :].tolist()
        return tokens, None if wav is None else wav.reshape(-1).float().cpu().numpy()


class TalkerModel(EngineModel):
    """Qwen2.5-Omni's talker in the batching engine: each decoding step is fed its last codec id's
    embedding plus the thinker's reply embedding for that step (from the row's `ReplyFeed`, the pad
    once the reply is spent), as the talker's own `generate` feeds it; positions continue from the
    talker's M-RoPE deltas."""

    def __init__(self, adapter: Qwen25Omni) -> None:
        talker = adapter.model.talker
        super().__init__(talker, {talker.codec_pad_token, talker.codec_eos_token})
        self.adapter = adapter

    def position_offset(self) -> int:
        # The talker keeps its deltas on itself; transformers' `generate` (5.2x) leaves them unset
        # (its prefill gets no attention mask) and decodes at the cache length: so do we.
        deltas = self.module.rope_deltas
        return 0 if deltas is None else int(deltas.reshape(-1)[0])

    def generation_config(self, sampling: Any) -> Any:
        config = super().generation_config(sampling)
        config.update(**self.adapter.talker_sampling(sampling.temperature or 0.0))
        return config

    def step_inputs(self, rows: list[Any], ids: Any) -> dict[str, Any]:
        import torch

        reply = torch.stack([row.feed.at(len(row.tokens) - 1) for row in rows])
        return {"inputs_embeds": self.module.get_input_embeddings()(ids) + reply[:, None]}


class Token2WavStream:
    """Token2wav decoding an utterance chunk by chunk while its codes arrive, as Qwen's reference
    streaming decode does.

    The DiT attends within blocks of `block_size` mel frames, some layers one block back or ahead,
    so a chunk's mel is sampled on a window holding the chunk and the blocks its attention reaches
    on either side (the starting noise sliced from one seeded sequence for the utterance). BigVGAN
    is convolutional: each new stretch of mel is vocoded with `CONTEXT` frames of mel on the left,
    and the last `CONTEXT` frames wait for their right neighbours. Time to first audio is one chunk
    (`CHUNK_BLOCKS` blocks of mel, plus the look-ahead) instead of the whole utterance; later chunks
    double in size, so that the context sampled twice costs little, and take all the codes that
    piled up when the vocoder is behind (fewer windows under load); an utterance that ends within
    its first chunk is decoded exactly as `Qwen25Omni.vocode` decodes it.
    """

    CHUNK_BLOCKS = 3  # mel frames of the first chunk: 3 blocks of 24, 0.72 s of audio
    MAX_CHUNK_BLOCKS = 12  # later chunks double up to this: less context recomputed per frame
    CONTEXT = 20  # mel frames of context around each vocoded stretch

    def __init__(self, adapter: Qwen25Omni, speaker: str, seed: int) -> None:
        import torch

        token2wav = adapter.model.token2wav
        self.adapter = adapter
        config = token2wav.code2wav_dit_model.config
        self.repeats, self.block = config.repeats, config.block_size
        self.chunk = self.CHUNK_BLOCKS * self.block  # mel frames of the next chunk
        self.behind = self.block * len(config.look_backward_layers)
        self.ahead = self.block * len(config.look_ahead_layers)
        # audio samples per mel frame
        self.hop = int(np.prod(token2wav.code2wav_bigvgan_model.config.upsample_rates))
        self.speaker, self.seed = speaker, seed
        self.noise = torch.empty(1, 0, config.mel_dim)
        self.codes: list[int] = []
        self.mel: list[Any] = []  # [1, mel_dim, frames] per finished chunk
        self.mel_frames = 0
        self.vocoded = 0  # mel frames already turned into audio
        self.playout = Playout(SAMPLE_RATE_OUT)  # when the listener needs more: the batcher's deadline

    def push(self, codes: list[int]) -> np.ndarray:
        """Audio that became final with these codes (often none)."""
        self.codes.extend(codes)
        frames = len(self.codes) * self.repeats
        while frames >= self.mel_frames + self.chunk + self.ahead:
            # After the first chunk, every whole block that has its look-ahead: a stream whose codes
            # piled up (the vocoder behind its talker) catches up in one window.
            ready = (frames - self.ahead - self.mel_frames) // self.block * self.block
            self._sample(
                self.mel_frames + (max(self.chunk, ready) if self.mel_frames else self.chunk), frames
            )
            self.chunk = min(2 * self.chunk, self.MAX_CHUNK_BLOCKS * self.block)
        return self._hand_out(self._vocode(final=False))

    def finish(self) -> np.ndarray:
        """The rest of the utterance's audio."""
        frames = len(self.codes) * self.repeats
        if frames > self.mel_frames:
            self._sample(frames, frames)
        return self._hand_out(self._vocode(final=True))

    def _hand_out(self, audio: np.ndarray) -> np.ndarray:
        self.playout.handed_out(len(audio))
        return audio

    def _sample(self, end: int, available: int) -> None:
        """Mel frames from `self.mel_frames` to `end`, sampled on a window with their context."""
        import torch

        start = self.mel_frames
        first, last = max(0, start - self.behind), min(end + self.ahead, available)
        codes = torch.tensor(
            [self.codes[first // self.repeats : last // self.repeats]], device=self.adapter.device
        )
        key = ("dit", self.speaker, codes.shape[1])  # windows of one length and voice sample together
        mel = self.adapter.vocoder_batcher(
            key, (codes[0], self._noise(first, last)[0]), self.playout.deadline()
        )
        self.mel.append(mel[None, :, start - first : end - first])
        self.mel_frames = end

    def _noise(self, first: int, last: int) -> Any:
        """The utterance's starting noise over frames [first, last): one seeded sequence, drawn in
        doublings (a longer draw from the same seed starts with the shorter one)."""
        import torch

        if last > self.noise.shape[1]:
            generator = torch.Generator().manual_seed(self.seed)
            size = max(last, 2 * self.noise.shape[1], 256)
            self.noise = torch.randn([1, size, self.noise.shape[2]], generator=generator)
        return self.noise[:, first:last].to(self.adapter.device)

    def _vocode(self, final: bool) -> np.ndarray:
        """Audio for the mel frames whose right context is known (all of them when `final`)."""
        import torch

        done = self.mel_frames if final else self.mel_frames - self.CONTEXT
        if done <= self.vocoded:
            return np.zeros(0, dtype=np.float32)
        mel = torch.cat(self.mel, dim=2)
        self.mel = [mel[:, :, -self.CONTEXT * 2 :]]  # all that later stretches can need
        offset = self.mel_frames - mel.shape[2]  # frame number of mel[..., 0]
        first = max(self.vocoded - self.CONTEXT, offset)
        stretch = mel[0, :, first - offset :]
        wav = self.adapter.vocoder_batcher(("bigvgan", stretch.shape[1]), stretch, self.playout.deadline())
        audio = wav[(self.vocoded - first) * self.hop : (done - first) * self.hop]
        self.vocoded = done
        return audio.float().cpu().numpy()


@contextlib.contextmanager
def _speaker_encoded(dit: Any, ref_mel: Any) -> Iterator[None]:
    """While inside, `dit` takes its speaker encoding of `ref_mel` (`[windows, time, mel_dim]`) as
    computed once here: the speaker encoder (an ECAPA-TDNN over the reference mel, and over zeros
    for the unguided half) gives the same at every one of the sampler's 36 evaluations, and took
    more than half of a tiny DiT window's time (measured, CPU). This instance's encoder stands in for
    the DiT's own (the vocoder's lock is held: nothing else runs the DiT meanwhile)."""
    import torch

    embedding = dit.input_embed
    encoder = embedding.spk_encoder
    encoded = encoder(torch.cat([ref_mel, torch.zeros_like(ref_mel)]))  # as the guidance stacks them

    class SpeakerEncoded(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            return encoded

    embedding.spk_encoder = SpeakerEncoded()
    try:
        yield
    finally:
        embedding.spk_encoder = encoder


def _dit_sample(dit: Any, cond: Any, ref_mel: Any, codes: Any, noise: Any) -> Any:
    """The token2wav DiT's mel `[1, mel_dim, frames]` for `codes` from the starting `noise`: the
    sampling of transformers' `Qwen2_5OmniToken2WavDiTModel.sample` (10 Runge-Kutta steps with
    classifier-free guidance 0.5 and sway -1), which draws its own noise and so cannot start from a
    slice of the utterance's."""
    import torch
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    speaker = cond.unsqueeze(1).repeat(1, noise.shape[1], 1)

    def velocity(time: Any, state: Any) -> Any:
        both = dit(
            hidden_states=state,
            quantized_code=codes,
            speaker_embedding=speaker,
            condition_vector=ref_mel,
            time_step=time,
            apply_cfg=True,
        )
        guided, unguided = torch.chunk(both, 2, dim=0)
        return guided + (guided - unguided) * 0.5

    times = torch.linspace(0, 1, 10, device=codes.device, dtype=speaker.dtype)
    times += -1.0 * (torch.cos(torch.pi / 2 * times) - 1 + times)
    return RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(times)[-1].permute(0, 2, 1)
