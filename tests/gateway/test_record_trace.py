"""`--record-trace`: one workload line per answered chat completion, readable by the workload reader and the replay."""

from __future__ import annotations

import httpx
import openai
from gateway_apps import ADMIN, ANSWER, TOKEN, data_url, png
from toy.executors import EXECUTORS

from prismserve.bench.workloads import read_requests
from prismserve.gateway import create_gateway
from prismserve.gateway.trace_recorder import TraceRecorder
from prismserve.planner.replay import read_trace
from prismserve.runtime import LocalRuntime


def ask(client: openai.OpenAI, text: str, image: bytes | None, stream: bool) -> int:
    content: list[dict] = [{"type": "text", "text": text}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": data_url(image)}})
    messages = [{"role": "user", "content": content}]
    if not stream:
        answer = client.chat.completions.create(model="answer", messages=messages, max_tokens=5)
        return answer.usage.completion_tokens
    chunks = client.chat.completions.create(
        model="answer", messages=messages, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    return [chunk for chunk in chunks if chunk.usage][0].usage.completion_tokens


def test_each_answered_chat_request_is_one_trace_line(tmp_path, serve_gateway):
    path = tmp_path / "trace.jsonl"
    recorder = TraceRecorder(path)
    app = create_gateway(LocalRuntime(EXECUTORS), admin_token=TOKEN, trace=recorder)
    with serve_gateway(app) as url, httpx.Client(base_url=url, timeout=30) as admin:
        assert (
            admin.post("/admin/apps", json={"name": "answer", "source": ANSWER}, headers=ADMIN).status_code
            == 201
        )
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        outputs = [
            ask(client, "describe this picture please", png((64, 48)), stream=False),
            ask(client, "and now just text", None, stream=True),
        ]
    recorder.close()
    specs = read_requests(path)
    assert [s.text_tokens for s in specs] == [4, 4]
    assert [s.images for s in specs] == [((64, 48),), ()]
    assert [s.output_tokens for s in specs] == outputs and all(outputs)
    assert 0 <= specs[0].arrival_s <= specs[1].arrival_s
    trace = read_trace(path)
    assert [r.images for r in trace] == [1, 0] and [r.output_tokens for r in trace] == outputs
