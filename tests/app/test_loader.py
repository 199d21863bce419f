"""App loading: valid apps are typed and servable; every kind of bad app file gets one clear line."""

from __future__ import annotations

import asyncio
import textwrap

import pytest
from toy.executors import EXECUTORS

from prismserve.app import AppLoadError, load_app, load_app_source
from prismserve.app.config import SLO
from prismserve.protocol.chat import ChatRequest
from prismserve.runtime.local import LocalDispatcher
from prismserve.task import use_dispatcher

HEADER = """
from collections.abc import AsyncIterator
from pydantic import BaseModel
from prismserve.app import AppConfig
from toy.tasks import ChatRequest, MLLMTask
"""

ANSWER_APP = (
    HEADER
    + """
mllm = MLLMTask(model_id="m")

class Config(AppConfig):
    tasks = {"mllm": mllm}

class Answer(BaseModel):
    text: str

async def serve(request: ChatRequest) -> Answer:
    response = await mllm(request)
    return Answer(text=" ".join([t async for t in response.text]))
"""
)

STREAM_APP = (
    HEADER
    + """
mllm = MLLMTask(model_id="m")

class Config(AppConfig):
    tasks = {"mllm": mllm}

class Token(BaseModel):
    token: str

async def serve(request: ChatRequest) -> AsyncIterator[Token]:
    async for token in (await mllm(request)).text:
        yield Token(token=token)
"""
)


def src(text: str) -> str:
    return textwrap.dedent(text)


def serve(app, request):
    async def scenario():
        with use_dispatcher(LocalDispatcher(EXECUTORS)):
            result = await app.serve(request)
            if app.streaming:
                return [chunk async for chunk in result]
            return result

    return asyncio.run(scenario())


def test_app_with_a_response_model_loads_and_serves(tmp_path):
    path = tmp_path / "answer.py"
    path.write_text(ANSWER_APP)
    app = load_app(path)
    assert app.name == "answer"
    assert app.request_model.__name__ == "ChatRequest" and app.response_model.__name__ == "Answer"
    assert not app.streaming
    assert list(app.tasks) == ["mllm"]
    answer = serve(app, {"messages": [{"role": "user", "content": [{"type": "text", "text": "two words"}]}]})
    assert answer.text == "[0 media, 0.000] user: two words"


def test_streaming_app_yields_typed_chunks():
    app = load_app_source(STREAM_APP, "stream")
    assert app.streaming and app.response_model.__name__ == "Token"
    chunks = serve(app, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]}')
    assert [c.token for c in chunks] == ["[0 media, 0.000]", "user:", "a", "b"]


def test_bad_request_data_is_a_validation_error_naming_the_field():
    app = load_app_source(ANSWER_APP, "answer")
    with pytest.raises(ValueError, match="messages"):
        app.parse_request({"modalities": ["text"]})
    with pytest.raises(ValueError, match="max_tokens"):
        app.parse_request(ChatRequest.of("x").model_dump() | {"max_tokens": 0})


BAD_APPS = {
    "no_config": (
        HEADER + "async def serve(request: ChatRequest) -> ChatRequest:\n    return request\n",
        r"no_config\.py: no `Config` found; declare a class Config deriving from prismserve\.app\.AppConfig",
    ),
    "config_not_appconfig": (
        HEADER + "class Config:\n    tasks = {}\nasync def serve(request: ChatRequest) -> ChatRequest: ...\n",
        r"`Config` must be a class deriving from prismserve\.app\.AppConfig",
    ),
    "no_tasks": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {}\nasync def serve(request: ChatRequest) -> ChatRequest: ...\n",
        r"Config\.tasks must be a non-empty dict",
    ),
    "task_not_a_task": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {'x': 3}\nasync def serve(request: ChatRequest) -> ChatRequest: ...\n",
        r"Config\.tasks\['x'\] must map a string to a Task instance, got int",
    ),
    "no_serve": (
        HEADER + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n",
        r"no `async def serve\(request\)` function found",
    ),
    "serve_not_async": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n"
        + "def serve(request: ChatRequest) -> ChatRequest:\n    return request\n",
        r"serve must be declared `async def serve\(request\)`",
    ),
    "request_not_model": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n"
        + "async def serve(request: dict) -> ChatRequest:\n    return request\n",
        r"request parameter must be annotated with a pydantic model, got <class 'dict'>",
    ),
    "response_not_model": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n"
        + "async def serve(request: ChatRequest) -> str:\n    return ''\n",
        r"serve's response type must be a pydantic model, got <class 'str'>",
    ),
    "chunk_not_model": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n"
        + "async def serve(request: ChatRequest) -> AsyncIterator[dict]:\n    yield {}\n",
        r"serve's streamed chunk type must be a pydantic model",
    ),
    "no_return_annotation": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n"
        + "async def serve(request: ChatRequest):\n    return request\n",
        r"annotate serve's return type",
    ),
    "two_arguments": (
        HEADER
        + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n"
        + "async def serve(request: ChatRequest, extra: int) -> ChatRequest:\n    return request\n",
        r"serve must take exactly one argument",
    ),
    "syntax_error": (
        HEADER + "class Config(AppConfig)\n    tasks = {}\n",
        r"syntax_error\.py:6: syntax error: expected ':'",
    ),
    "import_error": (
        HEADER + "from prismserve.nowhere import Thing\n",
        r"import_error\.py:6: error while importing the app: ModuleNotFoundError: No module named 'prismserve\.nowhere'",
    ),
    "raises_at_import": (
        HEADER + "MLLMTask(model_id=3)\n",
        r"raises_at_import\.py:6: error while importing the app: ValidationError: 1 validation error for MLLMTask",
    ),
    "unserialisable_unit_config": (
        HEADER
        + "from toy.tasks import EncoderTask\n"
        + "class Bad(EncoderTask):\n    hook: object = None\n"
        + "class Config(AppConfig):\n    tasks = {'e': Bad(model_id='m', modality='image', hook=lambda x: x)}\n",
        (
            r"unserialisable_unit_config\.py:10: Bad\.hook cannot be serialised \(Unable to serialize unknown "
            r"type: <class 'function'>\): unit-task configuration must be plain data"
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_APPS))
def test_bad_app_file_is_reported_in_one_line(tmp_path, name):
    source, pattern = BAD_APPS[name]
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    with pytest.raises(AppLoadError, match=pattern) as info:
        load_app(path)
    message = str(info.value).splitlines()[0]
    assert message.startswith(str(path))
    assert "Traceback" not in str(info.value)


def test_missing_file_and_bad_name_are_reported(tmp_path):
    with pytest.raises(AppLoadError, match="cannot read app file"):
        load_app(tmp_path / "absent.py")
    for junk in ("../etc", "a//b", "/abs", "a/", "has space", ".hidden", "x" * 129):
        with pytest.raises(AppLoadError, match=f"app name {junk!r} is invalid"):
            load_app_source(ANSWER_APP, junk)


def test_hub_ids_are_app_names():
    """`prismserve serve Qwen/Qwen2.5-Omni-7B` registers the app under the hub id."""
    names = ("Qwen/Qwen2.5-Omni-7B", "01-ai/Yi-1.5", "a/b", "a_b", "a.b")
    apps = [load_app_source(ANSWER_APP, name) for name in names]
    assert [app.name for app in apps] == list(names)
    assert len({app.module.__name__ for app in apps}) == len(names)  # a/b, a_b, a.b stay apart


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        (
            "slos = {'text': {'ttft': 1}}",
            r"Config\.slos\['text'\]\.ttft: Extra inputs are not permitted; an SLO",
        ),
        (
            "slos = {'text': {'ttft_s': -1}}",
            r"Config\.slos\['text'\]\.ttft_s: Input should be greater than 0",
        ),
        ("slos = {'text': 3}", r"Config\.slos\['text'\]: Input should be a valid dictionary"),
        (
            "replica_routing = {'m.nowhere': 'tokens'}",
            r"names 'm\.nowhere', not a deployment of the app: use one of \[",
        ),
        (
            "replica_routing = {'m.llm': 'fastest'}",
            r"replica_routing\['m\.llm'\] is 'fastest': use one of static, dynamic, tokens",
        ),
        (
            "autoscale = {'stages': ['m.llm'], 'capacity': {'m.llm': 0}}",
            r"Config\.autoscale: capacity\['m\.llm'\] must be > 0",
        ),
        (
            "autoscale = {'stages': ['m.llm'], 'min_replicas': {'m.llm': 0}}",
            r"Config\.autoscale: min_replicas\['m\.llm'\] must be >= 1",
        ),
        (
            "autoscale = {'stages': ['m.llm'], 'min_replicas': {'m.llm': 3}, 'max_replicas': {'m.llm': 2}}",
            r"max_replicas\['m\.llm'\] \(2\) is below min_replicas \(3\)",
        ),
        (
            "autoscale = {'stages': ['m.nowhere']}",
            r"Config\.autoscale names \['m\.nowhere'\], not deployments",
        ),
        (
            "slos = {'text+image': {'ttft_s': 1}}\n    input_modalities = frozenset({'text', 'image'})",
            r"Config\.slos names request type 'text\+image', which no chat request has: write 'image\+text'",
        ),
        ("slos = {'image': {'ttft_s': 1}}", r"request type 'image', which no chat request has: name input"),
        ("slos = {'text->audio': {'ttft_s': 1}}", r"request type 'text->audio', which no chat request has"),
        ("autoscale = {'stages': []}", r"Config\.autoscale\.stages: Tuple should have at least 1 item"),
    ],
)
def test_bad_slos_replica_routing_and_autoscaling_are_refused_at_load(config, pattern):
    source = HEADER + f"class Config(AppConfig):\n    tasks = {{'m': MLLMTask(model_id='m')}}\n    {config}\n"
    source += "async def serve(request: ChatRequest) -> ChatRequest:\n    return request\n"
    with pytest.raises(AppLoadError, match=pattern):
        load_app_source(source, "bad")


def test_an_app_names_slos_per_request_type_with_a_default():
    source = HEADER + "class Config(AppConfig):\n    tasks = {'m': MLLMTask(model_id='m')}\n"
    source += "    slos = {'text': {'ttft_s': 0.5}, 'default': {'e2e_s': 9}}\n"
    source += "async def serve(request: ChatRequest) -> ChatRequest:\n    return request\n"
    app = load_app_source(source, "slo")
    assert app.slo("text").ttft_s == 0.5 and app.slo("image+text").e2e_s == 9
    assert app.slo("text").met(0.4, None, 100) and not app.slo("text").met(0.6, None, 0.6)
    longer = SLO(ttft_s=0.2, ttft_per_token_s=0.001)  # a long prompt may take longer to its first token
    assert longer.met(0.5, None, 9, tokens=400) and not longer.met(0.5, None, 9, tokens=100)
    assert longer.first_due_s(400) == pytest.approx(0.6) and SLO(e2e_s=3).first_due_s(400) == 3
