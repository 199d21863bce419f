"""OpenAI conformance of the chat completions API on a real engine: the official `openai` client
drives every sampling parameter through the gateway to the tiny Qwen2.5-VL's transformers LLM (the
default app `prismserve serve` writes for it, encoder fissioned, in process), and the answer's
finish reason, usage and log-probabilities are the engine's."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from default_gateway import default_app_gateway
from openai_checks import check_context, check_sampling, check_structured

from prismserve.gateway import create_gateway
from prismserve.runtime import LocalRuntime

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NAME = "tiny/qwen2.5-vl"  # served under a hub-style name
TOKEN = "conformance"
PROMPT = "Tell me a story about a robot."


@pytest.fixture(scope="module")
def client(tiny_vl, serve_gateway):
    """The `openai` client of a gateway serving the tiny Qwen2.5-VL's default app."""
    with default_app_gateway(serve_gateway, tiny_vl, NAME) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client, text: str = PROMPT, **options):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": text}], **options)


def streamed(client, text: str = PROMPT, **options) -> tuple[str, list]:
    """The text of a streamed answer and its chunks."""
    chunks = list(ask(client, text, stream=True, **options))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def prompt_tokens(model: str, text: str, image: bytes | None = None) -> int:
    """How many tokens the LLM should be fed for one user message (`image` first, then `text`),
    counted with the checkpoint's own tokenizer and image processor, not with the server's code:
    the chat template with one `<|image_pad|>` per image, which the model expands to one token per
    merged patch of the processor's grid."""
    from PIL import Image
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    content = ([{"type": "image"}] if image is not None else []) + [{"type": "text", "text": text}]
    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True
    )
    count = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if image is None:
        return count
    processor = Qwen2VLImageProcessorPil.from_pretrained(model)
    grid = processor(images=[Image.open(io.BytesIO(image)).convert("RGB")])["image_grid_thw"]
    return count - 1 + int(grid.prod()) // processor.merge_size**2


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == [NAME]


def test_the_sampling_contract_every_engine_keeps(client, tiny_vl):
    check_sampling(client, NAME, prompt_tokens(tiny_vl, PROMPT))


def test_json_replies_and_tool_calls(client):
    check_structured(client, NAME)


def test_what_does_not_fit_the_context_is_a_400_context_length_exceeded(client):
    check_context(client, NAME, 4096)  # the tiny checkpoint's max_position_embeddings


def test_usage_counts_the_image_tokens(client, tiny_vl, small_png):
    """Usage counts the prompt the engine saw, image tokens included."""
    image = f"data:image/png;base64,{base64.b64encode(small_png).decode()}"
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is it?"}]
    seen = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": content}], max_tokens=3, temperature=0
    )
    assert seen.usage.prompt_tokens == prompt_tokens(tiny_vl, "What is it?", small_png)
    assert seen.usage.prompt_tokens > prompt_tokens(tiny_vl, "What is it?") + 1  # image tokens counted


def test_stream_reports_finish_reason_and_usage(client):
    text, chunks = streamed(client, max_tokens=6, temperature=0, stream_options={"include_usage": True})
    assert text == ask(client, max_tokens=6, temperature=0).choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_strings_cut_the_reply(client):
    """The reply ends before the first stop string ("stop"), streamed or not."""
    whole = ask(client, max_tokens=16, temperature=0).choices[0].message.content
    stop = whole[5:8]
    cut = whole[: whole.find(stop)]
    answer = ask(client, max_tokens=16, temperature=0, stop=[stop, "never in there \u2603"])
    assert answer.choices[0].message.content == cut
    assert answer.choices[0].finish_reason == "stop"
    assert streamed(client, max_tokens=16, temperature=0, stop=stop)[0] == cut


def test_temperature_seed_and_top_p(client):
    """A seed fixes a sampled reply; another seed changes it; a tiny top_p leaves only the likeliest
    token at each step (greedy's reply, however hot)."""
    greedy = ask(client, max_tokens=8, temperature=0).choices[0].message.content
    first, again, other = (
        ask(client, max_tokens=8, temperature=1.5, seed=seed).choices[0].message.content for seed in (3, 3, 4)
    )
    assert first == again and first != other and first != greedy
    nucleus = ask(client, max_tokens=8, temperature=1.5, top_p=1e-6, seed=4).choices[0].message.content
    assert nucleus == greedy
    # vLLM's extensions: top_k 1 and min_p 1 leave the likeliest token alone too.
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        hot = ask(client, max_tokens=8, temperature=1.5, seed=4, extra_body=extra)
        assert hot.choices[0].message.content == greedy, extra


def test_n_choices_are_samples_of_their_own_and_a_seed_fixes_them_all(client):
    """`n` choices: with a seed, choice i is the answer of seed + i (so they differ, and the
    whole answer is reproducible); the usage counts the prompt once and every choice's tokens."""
    answer = ask(client, max_tokens=6, temperature=1.5, seed=3, n=3)
    texts = [choice.message.content for choice in answer.choices]
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    assert texts == [
        ask(client, max_tokens=6, temperature=1.5, seed=seed).choices[0].message.content for seed in (3, 4, 5)
    ]
    assert len(set(texts)) > 1
    one = ask(client, max_tokens=6, temperature=1.5, seed=3).usage
    assert answer.usage.prompt_tokens == one.prompt_tokens
    assert answer.usage.completion_tokens == sum(
        ask(client, max_tokens=6, temperature=1.5, seed=seed).usage.completion_tokens for seed in (3, 4, 5)
    )
    # Streamed: each choice's deltas under its index, the same texts.
    chunks = list(ask(client, max_tokens=6, temperature=1.5, seed=3, n=3, stream=True))
    streamed_texts = [
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
        for i in range(3)
    ]
    assert streamed_texts == texts
    finishes = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(f.index for f in finishes) == [0, 1, 2]


def test_penalties_are_honoured(client):
    greedy = ask(client, max_tokens=24, temperature=0).choices[0].message.content
    assert ask(client, max_tokens=24, temperature=0, frequency_penalty=2).choices[0].message.content != greedy
    assert ask(client, max_tokens=24, temperature=0, presence_penalty=2).choices[0].message.content != greedy
    repeated = ask(client, max_tokens=24, temperature=0, extra_body={"repetition_penalty": 1.9})
    assert repeated.choices[0].message.content != greedy


def test_logprobs(client):
    """One entry per generated token, its top alternatives, greedy's choice the likeliest; streamed
    entries add up to the same."""
    answer = ask(client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    entries = answer.choices[0].logprobs.content
    assert len(entries) == answer.usage.completion_tokens == 5
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
        assert bytes(entry.bytes).decode(errors="replace") == entry.token
    _, chunks = streamed(client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    streamed_entries = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed_entries] == [(e.token, e.logprob) for e in entries]
    assert ask(client, max_tokens=2, temperature=0).choices[0].logprobs is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"extra_body": {"logit_bias": {"1": 5}}}, "logit_bias"),
        ({"extra_body": {"prediction": {"type": "content", "content": "x"}}}, "prediction"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "'g', which is not among the tools",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                }
            },
            "response_format.json_schema.schema: the JSON Schema cannot be followed",
        ),
        ({"n": 129}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"top_p": 0}, "top_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_a_parameter_not_honoured_is_a_400_naming_it(client, options, field):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, max_tokens=2, **options)
    assert field in caught.value.message
    assert caught.value.body["type"] == "invalid_request_error"
    assert ask(client, max_tokens=1).choices[0].message.role == "assistant"  # still serving


def test_an_engine_that_cannot_sample_refuses_naming_the_field(client, tiny_omni, serve_gateway):
    """The Omni monolith (transformers' end-to-end `generate`) decodes greedily: a sampled request is
    a 400 naming the field, not a greedy answer."""
    source = (
        "from prismserve.app import AppConfig\n"
        "from collections.abc import AsyncIterator\n"
        "from prismserve.protocol.chat import ChatChunk, ChatRequest\n"
        "from prismserve.tasklib import OmniTask, chat_chunks\n"
        f"omni = OmniTask(model={tiny_omni!r}, monolith=True)\n"
        "class Config(AppConfig):\n"
        "    tasks = {'omni': omni}\n"
        "async def serve(request: ChatRequest) -> AsyncIterator[ChatChunk]:\n"
        "    async for chunk in chat_chunks(await omni(request)):\n"
        "        yield chunk\n"
    )
    app = create_gateway(LocalRuntime(), admin_token=TOKEN)
    with serve_gateway(app) as url:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        registered = httpx.post(
            f"{url}/admin/apps", json={"name": "whole", "source": source}, headers=headers
        )
        assert registered.status_code == 201, registered.text
        whole = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "hi"}]
        for options, field in (({"temperature": 0.7}, "temperature"), ({"stop": ["x"]}, "stop")):
            with pytest.raises(openai.BadRequestError, match=field):
                whole.chat.completions.create(model="whole", messages=messages, max_tokens=2, **options)
        answer = whole.chat.completions.create(model="whole", messages=messages, max_tokens=2, temperature=0)
        assert answer.usage.completion_tokens == 2 and answer.choices[0].finish_reason == "length"
