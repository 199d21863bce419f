"""Qwen2.5-Omni: image and audio encoders, a thinker LLM, a talker and token2wav (DiT + BigVGAN).

Split points and what crosses them:
- encoders -> thinker: image embeddings + `grid_thw`; audio embeddings + the clip's mel-feature
  length (the thinker's 3-D rotary positions need both). The thinker is fed `inputs_embeds` with the
  embeddings in place of the media tokens, so it runs exactly the monolith's computation.
- thinker -> talker: the talker's conditioning, built as transformers' `generate` builds it: per
  position the thinker's input embedding plus last hidden state (media positions zeroed), the
  speaker's text-start embedding, and the reply part (generated tokens, then text end and pad).
- talker -> token2wav: codec ids; token2wav turns them into 24 kHz audio with the speaker's
  conditioning and reference mel.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np

from prismserve.models.base import (
    LOADING,
    Adapter,
    Encoded,
    MediaError,
    MediaInput,
    as_numpy,
    build_processor,
    token_streamer,
)
from prismserve.models.media import load_audio, load_image

SAMPLE_RATE_IN = 16000
SAMPLE_RATE_OUT = 24000


class Qwen25Omni(Adapter):
    """Qwen2.5-Omni (`Qwen2_5OmniForConditionalGeneration`)."""

    family = "qwen2.5-omni"
    encoder_modalities = ("image", "audio")

    model_class = "Qwen2_5OmniForConditionalGeneration"
    processor_class = "Qwen2_5OmniProcessor"

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

        dtype = "auto" if self.device != "cpu" else None
        with LOADING:
            model = getattr(transformers, self.model_class).from_pretrained(self.path, dtype=dtype)
        if not with_talker and model.has_talker:
            model.disable_talker()
        return model.to(self.device).eval()

    def llm(self) -> Any:
        return self.model.thinker

    # --- encoders -------------------------------------------------------------------------------
    def load_encoder(self, modality: str) -> None:
        self.check_modality(modality)
        thinker = self._load(with_talker=False).thinker.model
        # Keep the one tower this replica runs (and the module whose feature methods drive it).
        del thinker.language_model
        if modality == "image":
            del thinker.audio_tower
        else:
            del thinker.visual
        self.model = thinker
        self.processor  # noqa: B018 - loaded now rather than on the first request

    def encode(self, modality: str, items: list[bytes]) -> list[Encoded]:
        import torch

        self.check_modality(modality)
        if modality == "image":
            pixels = self.image_pixels([load_image(d) for d in items])
            grids = pixels["image_grid_thw"].to(self.device)
            with self.lock, torch.inference_mode():
                parts = self.model.get_image_features(
                    pixels["pixel_values"].to(self.device), grids
                ).pooler_output
            return [
                Encoded("image", as_numpy(p), {"grid_thw": g.tolist()})
                for p, g in zip(parts, grids, strict=True)
            ]
        clips = [load_audio(d, SAMPLE_RATE_IN) for d in items]
        features = self.processor.feature_extractor(
            clips, sampling_rate=SAMPLE_RATE_IN, return_attention_mask=True, return_tensors="pt"
        )
        mask = features["attention_mask"].to(self.device)
        with self.lock, torch.inference_mode():
            merged = self.model.get_audio_features(
                features["input_features"].to(self.device), mask
            ).last_hidden_state
        lengths = mask.sum(-1)
        sizes = self.audio_token_counts(lengths)
        parts = torch.split(merged, sizes)
        return [
            Encoded("audio", as_numpy(p), {"feature_length": int(n)})
            for p, n in zip(parts, lengths, strict=True)
        ]

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
    ) -> dict[str, Any]:
        text = self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        if media:
            return self._raw_inputs(text, media)
        if not encoded:
            return dict(self.processor(text=[text], return_tensors="pt").to(self.device))
        return self._embedded_inputs(text, encoded)

    def _raw_inputs(self, text: str, media: list[MediaInput]) -> dict[str, Any]:
        images = [load_image(m.data) for m in media if m.modality == "image"]
        clips = [load_audio(m.data, SAMPLE_RATE_IN) for m in media if m.modality == "audio"]
        unsupported = sorted({m.modality for m in media} - set(self.encoder_modalities))
        if unsupported:
            raise MediaError(
                f"{self.family} takes {', '.join(self.encoder_modalities)} input, not {unsupported}"
            )
        try:
            inputs = self.processor(
                text=[text], images=images or None, audio=clips or None, return_tensors="pt"
            )
        except ValueError as exc:
            raise MediaError(f"media cannot be processed: {exc}") from None
        return dict(inputs.to(self.device))

    def _embedded_inputs(self, text: str, encoded: list[Encoded]) -> dict[str, Any]:
        import torch

        tokens = {"image": self.processor.image_token, "audio": self.processor.audio_token}
        pieces, order = [], []
        rest = text
        while True:  # split at each media token, in the conversation's order
            found = [(rest.find(t), m) for m, t in tokens.items() if rest.find(t) >= 0]
            if not found:
                break
            at, modality = min(found)
            pieces.append(rest[:at])
            order.append(modality)
            rest = rest[at + len(tokens[modality]) :]
        if order != [e.modality for e in encoded]:
            raise MediaError(
                f"the conversation's media are {order} but the embeddings are {[e.modality for e in encoded]}"
            )
        expanded = (
            "".join(
                p + tokens[e.modality] * self.token_count(e) for p, e in zip(pieces, encoded, strict=True)
            )
            + rest
        )
        ids = self.tokenizer([expanded], return_tensors="pt")["input_ids"].to(self.device)
        thinker = self.model.thinker
        with torch.inference_mode():
            embeds = thinker.get_input_embeddings()(ids)
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        images = [e for e in encoded if e.modality == "image"]
        if images:
            embeds = self.place_images(inputs, embeds, images)
        clips = [
            torch.tensor(np.asarray(e.embeddings)) for e in encoded if e.modality == "audio"
        ]  # copies: may be read-only views
        if clips:
            mask = (ids == self.processor.audio_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(mask, torch.cat(clips).to(self.device, embeds.dtype))
        grids = [e.meta["grid_thw"] for e in encoded if e.modality == "image"]
        if grids:
            inputs["image_grid_thw"] = torch.tensor(grids, device=self.device)
        lengths = [e.meta["feature_length"] for e in encoded if e.modality == "audio"]
        if lengths:  # the positions of audio tokens come from the clips' feature lengths
            frames = torch.arange(max(lengths), device=self.device)
            inputs["feature_attention_mask"] = (
                frames < torch.tensor(lengths, device=self.device)[:, None]
            ).long()
        inputs["inputs_embeds"] = embeds
        return inputs

    def audio_token_counts(self, feature_lengths: Any) -> list[int]:
        """Embeddings the audio encoder makes of clips with these mel-feature lengths."""
        return self.model.audio_tower._get_feat_extract_output_lengths(feature_lengths)[1].tolist()

    def image_pixels(self, images: list[Any]) -> Any:
        """The image processor's tensors; images it cannot take are a MediaError."""
        try:
            return self.processor.image_processor(images=images, return_tensors="pt")
        except ValueError as exc:
            raise MediaError(f"image cannot be processed: {exc}") from None

    def token_count(self, encoded: Encoded) -> int:
        """How many placeholder tokens an encoded item takes in the thinker's prompt."""
        return len(encoded.embeddings)

    def place_images(self, inputs: dict[str, Any], embeds: Any, images: list[Encoded]) -> Any:
        """`embeds` with the images' embeddings at their tokens (more inputs may be added to `inputs`)."""
        import torch

        mask = (inputs["input_ids"] == self.processor.image_token_id).unsqueeze(-1)
        rows = torch.cat(
            [torch.tensor(np.asarray(e.embeddings)) for e in images]
        )  # copies: may be read-only views
        return embeds.masked_scatter(mask, rows.to(self.device, embeds.dtype))

    def speaker(self, name: str | None) -> str:
        """A speaker the checkpoint has (`name`, or its first)."""
        speakers = self.model.speaker_map
        if name is None:
            return next(iter(speakers))
        if name not in speakers:
            raise MediaError(f"{self.family} has no speaker {name!r}; it has {sorted(speakers)}")
        return name

    def talker_inputs(self, inputs: dict[str, Any], generated: Any, speaker: str) -> dict[str, np.ndarray]:
        """The talker's conditioning from the thinker's prompt, output and per-step hidden states."""
        import torch

        thinker, config = self.model.thinker, self.model.config
        ids = inputs["input_ids"]
        steps = generated.hidden_states
        prompt_embeds = steps[0][0].clone()
        media = torch.isin(ids, torch.tensor([config.thinker_config.audio_token_index, config.thinker_config.image_token_index,
                                             config.thinker_config.video_token_index], device=ids.device))  # fmt: skip
        prompt_embeds[media] = 0  # the talker does not see the media's embeddings
        token_embeds = [prompt_embeds] + [step[0] for step in steps[1:]]
        hidden = [steps[0][-1]] + [step[-1] for step in steps[1:]]
        embed = thinker.get_input_embeddings()
        talker = config.talker_config

        def token(token_id: int) -> Any:
            return embed(torch.tensor([[token_id]], device=ids.device))

        with torch.inference_mode():
            reply = torch.cat(hidden[1:], dim=1) + torch.cat(token_embeds[1:], dim=1)
            bos = self.model.speaker_map[speaker]["bos_token"]
            prefix = torch.cat([hidden[0] + token_embeds[0], token(bos), reply[:, :1]], dim=1)
            end, pad = token(talker.tts_text_end_token_id), token(talker.tts_text_pad_token_id)
            reply = torch.cat([reply[:, 1:], end, pad], dim=1)
            # As transformers does: text end right after the last real token, pads after it.
            tokens = torch.tensor(generated.token_ids, device=ids.device)
            eos = torch.tensor(sorted(self.eos_token_ids()), device=ids.device)
            positions = torch.arange(len(tokens), device=ids.device)
            first_end = (
                torch.where(torch.isin(tokens, eos), positions, len(tokens))
                .min()
                .clamp(min=1, max=len(tokens) - 1)
            )
            slots = torch.arange(reply.shape[1], device=ids.device)[None, :, None]
            reply = torch.where(slots >= first_end, pad, reply)
            reply = torch.where(slots == first_end - 1, end, reply)
            first = generated.token_ids[:1]
        out = {
            "input_ids": ids[0].cpu().numpy(),
            "text_ids": np.asarray([*ids[0].tolist(), bos, *first], dtype=np.int64),
            "prefix_embeds": as_numpy(prefix[0]),
            "reply_embeds": as_numpy(reply[0]),
        }
        if "image_grid_thw" in inputs:
            out["image_grid_thw"] = inputs["image_grid_thw"].cpu().numpy()
        if "feature_attention_mask" in inputs:
            out["audio_feature_lengths"] = inputs["feature_attention_mask"].sum(-1).cpu().numpy()
        return out

    # --- talker and token2wav -------------------------------------------------------------------
    def load_talker(self) -> None:
        """Load the talker alone."""
        model = self._load(with_talker=True)
        del model.thinker, model.token2wav
        self.model = model

    def talk(
        self,
        conditioning: dict[str, np.ndarray],
        max_codes: int,
        *,
        temperature: float = 0.0,
        on_code: Callable[[int], None] | None = None,
    ) -> list[int]:
        """The talker's codec ids for the thinker's output (greedy at temperature 0); `on_code` sees
        each id as it is generated (the end token included)."""
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
        extra = {}
        if "image_grid_thw" in conditioning:
            extra["image_grid_thw"] = tensor("image_grid_thw")
        if "audio_feature_lengths" in conditioning:
            extra["audio_feature_lengths"] = tensor("audio_feature_lengths")
        sampling = (
            {"do_sample": False}
            if temperature <= 0
            else {"do_sample": True, "temperature": temperature, "top_k": 40, "top_p": 0.8}
        )
        with self.lock, torch.inference_mode():
            dtype = talker.dtype
            out = talker.generate(
                input_ids=codec_prompt,
                input_text_ids=tensor("text_ids")[None],
                thinker_reply_part=tensor("reply_embeds")[None].to(dtype),
                inputs_embeds=tensor("prefix_embeds")[None].to(dtype),
                attention_mask=torch.ones_like(codec_prompt),
                suppress_tokens=[talker.codec_bos_token],
                eos_token_id=[talker.codec_pad_token, talker.codec_eos_token],
                pad_token_id=talker.codec_pad_token,
                repetition_penalty=1.05,
                max_new_tokens=max_codes,
                streamer=token_streamer(on_code) if on_code is not None else None,
                **sampling,
                **extra,
            )
        return self.until_end(out[0, codec_prompt.shape[1] :].tolist())

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
        """24 kHz float32 audio for `codes`; `seed` fixes the diffusion's starting noise."""
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

    # --- the whole model ------------------------------------------------------------------------
    def load_monolith(self) -> None:
        """Everything in one process, run by transformers' own `generate` (the baseline)."""
        self.model = self._load(with_talker=True)
        self.processor  # noqa: B018

    def generate_options(self, args: dict[str, Any], audio: bool) -> dict[str, Any]:
        """The model inputs and the arguments of transformers' `generate` that differ by family."""
        talker = self.model.talker
        if "pixel_values" in args:  # only the thinker takes pixels; the talker takes the grids
            args = {("thinker_pixel_values" if k == "pixel_values" else k): v for k, v in args.items()}
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
