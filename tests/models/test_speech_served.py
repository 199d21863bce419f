"""The Omni families' default apps speaking through the official `openai` client: the voices they
list are the checkpoint's speakers, and their speech streams (the transformers engine)."""

from __future__ import annotations

import base64
import json

import httpx
import openai
import pytest
from default_gateway import default_app_gateway

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
