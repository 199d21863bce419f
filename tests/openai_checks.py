"""Checks of the chat completions API's sampling contract that any engine must pass, through the
official `openai` client: used on the transformers engine (tests/models/test_openai_conformance.py)
and on vLLM's (tests/runtime/test_models_on_ray.py)."""

from __future__ import annotations

import openai


def check_sampling(client: openai.OpenAI, model: str, prompt_tokens: int) -> None:
    """Finish reasons, usage (the prompt is `prompt_tokens` long), stop strings, seeds and
    log-probabilities as the API promises them."""

    def ask(**options):
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me a story about a robot."}], **options
        )

    cut_short = ask(max_tokens=5, temperature=0)
    assert cut_short.choices[0].finish_reason == "length"
    usage = cut_short.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        prompt_tokens,
        5,
        prompt_tokens + 5,
    )
    whole = ask(max_tokens=16, temperature=0).choices[0].message.content
    stop = whole[5:8]
    stopped = ask(max_tokens=16, temperature=0, stop=[stop])
    assert stopped.choices[0].message.content == whole[: whole.find(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    drawn = [ask(max_tokens=8, temperature=1.5, seed=seed).choices[0].message.content for seed in (3, 3, 4)]
    assert drawn[0] == drawn[1] != drawn[2]
    entries = ask(max_tokens=4, temperature=0, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    assert len(entries) == 4
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in entries)
