"""The Omni families' default apps speaking through the official `openai` client: the voices they
list are the checkpoint's speakers, and their speech streams (the transformers engine)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import openai
import pytest
from default_gateway import default_app_gateway
from media_clips import video_clip, video_with_sound

from prismserve.app.settings import app_module_source
from prismserve.apps import OmniAppSettings
from prismserve.models import tiny


@pytest.mark.parametrize("family", ["qwen2.5-omni", "qwen3-omni"])
def test_an_omni_app_lists_its_checkpoints_voices_and_streams_speech_in_each(serve_gateway, family):
    model = str(tiny.build(family))
    with (
        default_app_gateway(serve_gateway, model, "omni") as url,
        httpx.Client(base_url=url, timeout=300) as http,
    ):
        listed = http.get("/v1/audio/voices", params={"model": "omni"})
        assert listed.status_code == 200, listed.text
        voices = listed.json()["voices"]
        assert listed.json()["model"] == "omni" and len(voices) >= 1
        assert http.get("/v1/audio/voices").json() == listed.json()  # the one app that speaks
        # The model refuses a voice it lacks naming the ones it has: the same list.
        body = {"model": "omni", "input": "Hi.", "voice": "Nobody", "response_format": "pcm"}
        refused = http.post("/v1/audio/speech", json=body)
        assert refused.status_code == 400 and str(sorted(voices)) in refused.json()["error"]["message"]

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with client.audio.speech.with_streaming_response.create(
            model="omni", input="Hi.", voice=voices[-1], response_format="pcm", stream_format="sse"
        ) as response:
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] >= 1
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(audio) > 0 and len(audio) % 2 == 0  # 16-bit samples


@pytest.mark.parametrize(
    ("family", "soundtrack_tokens"), [("qwen2.5-omni", range(50, 53)), ("qwen3-omni", range(26, 29))]
)
def test_an_omni_app_hears_a_clips_soundtrack_through_the_openai_client(
    serve_gateway, family, soundtrack_tokens
):
    """An Omni family's app (its default's modalities, shorter speech) answers a clip with its
    soundtrack (`mm_processor_kwargs.use_audio_in_video`, vLLM's extension, through the official
    client) in text and speech, the prompt counting the soundtrack's tokens; a clip without one is a
    400 that names it, and the app serves on."""
    model = str(tiny.build(family))
    settings = OmniAppSettings(model=model, modalities=("image", "audio", "video"), max_codes=30)
    source = app_module_source("prismserve.apps.omni", settings)
    with default_app_gateway(serve_gateway, model, "omni", source) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)

        def ask(clip: bytes, soundtrack: bool) -> Any:
            video = {
                "type": "video_url",
                "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(clip).decode()},
            }
            return client.chat.completions.create(
                model="omni",
                max_tokens=4,
                modalities=["text", "audio"],
                audio={"format": "wav"},  # the model's default voice
                messages=[
                    {"role": "user", "content": [video, {"type": "text", "text": "What do you hear?"}]}
                ],
                extra_body={"mm_processor_kwargs": {"use_audio_in_video": soundtrack}},
            )

        heard = ask(video_with_sound(20), soundtrack=True)
        seen = ask(video_with_sound(20), soundtrack=False)
        with pytest.raises(openai.BadRequestError, match="video #0 has no soundtrack"):
            ask(video_clip("mp4", 20), soundtrack=True)
        again = ask(video_clip("mp4", 20), soundtrack=False)
    for answer in (heard, seen, again):
        assert answer.choices[0].message.content
        assert base64.b64decode(answer.choices[0].message.audio.data)[:4] == b"RIFF"
    # 2 s of soundtrack (and AAC's priming samples), with its start and end.
    assert heard.usage.prompt_tokens - seen.usage.prompt_tokens - 2 in soundtrack_tokens
