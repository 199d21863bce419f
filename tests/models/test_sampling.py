"""Sampling on the transformers engine as a request asks for it: the checkpoint's generation config for
what it leaves unset, OpenAI's penalties, log-probabilities, the context limit, and the reply text cut
at stop strings (`ReplyText`, shared with the vLLM executors)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig

from prismserve.executors.hf_engine import HFEngine, Penalties
from prismserve.executors.text import ReplyText
from prismserve.executors.vllm_llm import _logprobs, checkpoint_sampling
from prismserve.models import EngineModel, adapter_for
from prismserve.protocol.chat import ChatRequest, Sampling
from prismserve.task import InvalidInputError
from prismserve.tasklib import conversation

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def vl(tiny_vl):
    """The tiny Qwen2.5-VL LLM's adapter and a text prompt's inputs."""
    adapter = adapter_for(tiny_vl)
    adapter.load_llm(with_encoders=False)
    return adapter, adapter.llm_inputs(conversation(ChatRequest.of("Tell me a story about a robot."))[0])


class Limited(EngineModel):
    """An LLM whose context is `context` tokens."""

    def __init__(self, adapter, context: int) -> None:
        super().__init__(adapter.llm(), adapter.eos_token_ids())
        self.context = context

    def context_length(self) -> int | None:
        return self.context


def generate(model, inputs, max_tokens, **sampling):
    engine = HFEngine(model)
    try:
        return engine.submit(inputs, max_tokens, sampling=Sampling(**sampling)).result(timeout=300)
    finally:
        engine.close()


def test_unset_sampling_follows_the_generation_config(vl):
    """A request that leaves temperature unset samples as the checkpoint's generation config says
    (its seed then decides the draws); temperature 0 is greedy whatever the config says."""
    adapter, inputs = vl
    greedy = adapter.generate(inputs, 8).token_ids
    assert generate(adapter, inputs, 8, seed=1).token_ids == greedy  # the tiny config does not sample
    llm = adapter.llm()
    saved = llm.generation_config
    llm.generation_config = GenerationConfig(do_sample=True, temperature=1.5, eos_token_id=saved.eos_token_id)
    try:
        drawn = {seed: generate(adapter, inputs, 8, seed=seed).token_ids for seed in (1, 1, 2)}
        assert generate(adapter, inputs, 8, temperature=0.0, seed=2).token_ids == greedy
        nucleus = generate(adapter, inputs, 8, top_p=1e-6, seed=3).token_ids  # only the likeliest is left
    finally:
        llm.generation_config = saved
    assert drawn[1] != greedy and drawn[1] != drawn[2]
    assert nucleus == greedy


def test_penalties_lower_the_tokens_already_generated():
    """Presence once per token seen, frequency per time; the prompt is not counted, and each call
    counts only the ids added since the last."""
    penalties = Penalties(presence=0.5, frequency=0.25, prompt_length=2)
    scores = torch.zeros(1, 5)
    assert torch.equal(penalties(torch.tensor([[4, 4]]), scores), scores)  # the prompt alone
    out = penalties(torch.tensor([[4, 4, 1, 3, 1]]), scores)
    assert out.tolist() == [[0.0, -1.0, 0.0, -0.75, 0.0]]
    out = penalties(torch.tensor([[4, 4, 1, 3, 1, 3]]), scores)
    assert out.tolist() == [[0.0, -1.0, 0.0, -1.0, 0.0]]


def test_penalties_change_what_is_generated(vl):
    """A repetitive greedy reply repeats less under a frequency penalty."""
    adapter, inputs = vl
    greedy = generate(adapter, inputs, 24, temperature=0.0).token_ids
    penalised = generate(adapter, inputs, 24, temperature=0.0, frequency_penalty=2.0).token_ids
    assert penalised != greedy
    assert len(set(penalised)) > len(set(greedy))


def test_logprobs_are_the_raw_logits_log_softmax(vl):
    """Each token's log-probability and its step's most likely alternatives, from the logits the
    engine chose it from: greedy picks the first alternative."""
    adapter, inputs = vl
    entries = []
    engine = HFEngine(adapter)
    try:
        generation = engine.submit(
            inputs,
            5,
            sampling=Sampling(temperature=0.0, top_logprobs=3),
            with_logits=True,
            on_logprobs=entries.append,
        ).result(timeout=300)
    finally:
        engine.close()
    assert len(entries) == len(generation.token_ids) == 5
    for (logprob, top), token, logits in zip(entries, generation.token_ids, generation.logits, strict=True):
        expected = torch.log_softmax(torch.tensor(logits), -1)
        assert math.isclose(logprob, float(expected[token]), abs_tol=1e-5)
        assert [i for i, _ in top] == torch.topk(expected, 3).indices.tolist()
        assert top[0][0] == token


def test_max_tokens_unset_runs_to_the_context_limit(vl):
    """With no max_tokens a reply runs until the context is full ("length"); a larger max_tokens stops
    there too; a prompt that fills the context is the request's fault."""
    adapter, inputs = vl
    prompt = inputs["input_ids"].shape[1]
    full = generate(Limited(adapter, prompt + 4), inputs, None, temperature=0.0)
    assert len(full.token_ids) == 4 and full.finish_reason == "length" and full.prompt_tokens == prompt
    assert len(generate(Limited(adapter, prompt + 3), inputs, 50, temperature=0.0).token_ids) == 3
    with pytest.raises(InvalidInputError, match="context is"):
        generate(Limited(adapter, prompt), inputs, 5)


def test_max_tokens_unset_takes_the_generation_configs_max_new_tokens(vl):
    """As vLLM does: a checkpoint whose generation config sets `max_new_tokens` stops there."""
    adapter, inputs = vl
    config = adapter.llm().generation_config
    config.max_new_tokens = 3
    try:
        cut = generate(adapter, inputs, None, temperature=0.0)
    finally:
        config.max_new_tokens = None
    assert len(cut.token_ids) == 3 and cut.finish_reason == "length"


class Tokens:
    """A tokenizer stand-in for ReplyText's log-probability texts: id i is the letter chr(97 + i)."""

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def letters(stop: list[str]) -> ReplyText:
    """A ReplyText whose tokens are single letters (`Tokens`)."""
    out = ReplyText(Tokens(), set(), stop)
    out.decoder = SimpleNamespace(push=lambda token: chr(97 + token), flush=lambda: "")
    return out


def reply(text: str, stop: list[str]) -> tuple[list, ReplyText]:
    """The deltas ReplyText gives for `text` pushed a character at a time (each its own token)."""
    out = letters(stop)
    deltas = [d for d in (out.push(ord(c) - 97) for c in text) if d is not None]
    if not out.finished:
        deltas.append(out.finish("length", 7))
    return deltas, out


def test_reply_text_cuts_at_the_first_stop_string_and_holds_back_its_start():
    deltas, out = reply("abcdefgh", ["def", "cx"])
    assert "".join(d.text for d in deltas) == "abc" and out.stopped
    assert deltas[-1].finish_reason == "stop"
    # "c" could start "cx": held until "d" rules it out; no text of the stop string ever went out.
    assert [d.text for d in deltas] == ["a", "b", "c", ""]
    assert sum(d.tokens for d in deltas) == 6  # every token generated is counted, the stop string's too


def test_reply_text_without_a_stop_match_gives_everything():
    deltas, out = reply("abcab", ["zz"])
    assert "".join(d.text for d in deltas) == "abcab" and not out.stopped
    assert deltas[-1].finish_reason == "length" and deltas[-1].prompt_tokens == 7
    assert sum(d.tokens for d in deltas) == 5


def test_reply_text_reports_logprobs_with_their_tokens():
    out = letters([])
    delta = out.push(1, (-0.5, [(1, -0.5), (2, -1.5)]))
    assert delta is not None and delta.logprobs is not None
    (entry,) = delta.logprobs
    assert (entry.token, entry.logprob, entry.bytes) == ("b", -0.5, [98])
    assert [(t.token, t.logprob) for t in entry.top] == [("b", -0.5), ("c", -1.5)]


def test_vllm_defaults_and_logprobs_follow_the_same_rules():
    """The vLLM executors' sampling defaults: greedy unless the generation config samples, then its
    settings; a vLLM step's log-probabilities ranked as the API reports them."""
    assert checkpoint_sampling(GenerationConfig()) == {"temperature": 0.0}
    sampled = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=99)
    assert checkpoint_sampling(sampled) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_tokens": 99}
    step = {
        5: SimpleNamespace(logprob=-3.0, rank=7),  # the sampled token, outside the top 2
        1: SimpleNamespace(logprob=-0.1, rank=1),
        9: SimpleNamespace(logprob=-2.0, rank=2),
    }
    assert _logprobs(step, 5, 2) == (-3.0, [(1, -0.1), (9, -2.0)])
    assert _logprobs(step, 5, None) is None


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_a_json_schema_holds_every_sampled_reply_and_leaves_the_others_free(vl):
    """Sampled at temperature 1.5 beside free rows of the same batch, every reply held to the schema
    is compact JSON that validates and ends on an end token; the free rows are what they are alone."""
    import jsonschema

    adapter, inputs = vl
    engine = HFEngine(adapter)
    try:
        alone = engine.submit(inputs, 12).result(timeout=60).token_ids
        held = [Sampling(temperature=1.5, seed=seed, json_schema=SCHEMA) for seed in range(4)]
        futures = [engine.submit(inputs, 60, sampling=sampling) for sampling in held]
        free = engine.submit(inputs, 12)
        for future in futures:
            generated = future.result(timeout=120)
            assert generated.finish_reason == "stop" and generated.token_ids[-1] in adapter.eos_token_ids()
            text = adapter.tokenizer.decode(generated.token_ids[:-1])
            jsonschema.validate(json.loads(text), SCHEMA)
            assert " " not in text.replace(
                json.loads(text)["name"], ""
            )  # JSON's optional whitespace left out
        assert free.result(timeout=60).token_ids == alone
    finally:
        engine.close()


def test_a_schema_the_grammar_cannot_follow_fails_its_request_alone(vl):
    adapter, inputs = vl
    engine = HFEngine(adapter)
    try:
        with pytest.raises(InvalidInputError, match="json_schema cannot be followed"):
            engine.submit(inputs, 8, sampling=Sampling(json_schema={"type": "strin"})).result(timeout=60)
        assert len(engine.submit(inputs, 3).result(timeout=60).token_ids) == 3
    finally:
        engine.close()


def test_tools_and_tool_calls_reach_the_chat_template(vl):
    """The functions a request offers and the calls and results of earlier turns are what the chat
    template renders (the tiny checkpoint's own template shows neither: a template that does)."""
    from prismserve.protocol.chat import ChatMessage, TextPart, ToolCall

    adapter, _ = vl
    request = ChatRequest(
        messages=[
            ChatMessage(role="user", content=[TextPart(text="weather?")]),
            ChatMessage(
                role="assistant",
                content=[],
                tool_calls=[ToolCall(id="c1", name="weather", arguments='{"city": "Oslo"}')],
            ),
            ChatMessage(role="tool", content=[TextPart(text="sunny")], tool_call_id="c1"),
        ],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    )
    template = (
        "{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}[{{ m.role }}{% for c in m.tool_calls or [] %} call {{ c.function.name }}"
        "{{ c.function.arguments | tojson }}{% endfor %}{% if m.tool_call_id %} answers {{ m.tool_call_id }}"
        "{% endif %}]{% endfor %}"
    )
    saved, adapter.processor.chat_template = adapter.processor.chat_template, template
    try:
        inputs = adapter.llm_inputs(conversation(request)[0], tools=request.tools)
    finally:
        adapter.processor.chat_template = saved
    text = adapter.tokenizer.decode(inputs["input_ids"][0])
    assert text == '[tool weather][user][assistant call weather{"city": "Oslo"}][tool answers c1]'
