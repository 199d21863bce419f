"""Modality-aware serving (ModServe, 003 §4.3) on the in-process control plane: the task library's
encoder and LLM (as `MLLMTask` composes them, without weights) on `sim` replicas whose service time
follows the tokens each call carries, counted as the model's processor counts them."""

from __future__ import annotations

import asyncio
import time

from runtime_apps import ENCODER, LLM, first_token_s, plan, png, serving

from prismserve.protocol.chat import ChatRequest
from prismserve.tasklib import MediaTokens


def test_a_request_is_due_by_its_types_slo_for_its_prompt_tokens_text_and_media():
    """The deadline calls carry: the request's start plus its type's TTFT target for its tokens, as
    its largest call counts them (the LLM's prompt: text and every image)."""
    deployed = plan(1, 1, {}, {"items": 1})
    request = ChatRequest.of("x" * 400, images=[png(280, 560)] * 2)  # 100 text + 2 x 200 media tokens

    async def scenario(runtime, app):
        async with runtime.request(app.name, request.request_type) as clock:
            async for _ in await app.serve(request):
                pass
        return clock

    clock = serving(
        '    slos = {"image+text": {"ttft_s": 0.5, "ttft_per_token_s": 0.01}}', deployed, scenario
    )
    assert clock.ledger.tokens == 500 and clock.first_due() == clock.start + 0.5 + 0.01 * 500


def test_a_burst_of_8_image_requests_spreads_its_images_over_the_encoders_by_their_tokens():
    """Eight images of one request each go to the encoder with the fewest pending media tokens: with
    large and small images alternating, counting calls (request-static) piles every large image on
    one encoder while the other idles; counting tokens keeps both busy until the burst is done."""
    large, small = png(980, 980), png(280, 280)  # 1225 and 100 tokens (Qwen-VL's 28-px units)
    assert MediaTokens().count("image", large) == 1225 and MediaTokens().count("image", small) == 100
    burst = [ChatRequest.of(f"r{i}", images=[large, small] * 4) for i in range(2)]
    deployed = plan(2, 1, {"token_s": 0.0002}, {"items": 1})  # 0.25 s per large image, batch 1

    def idle_while_queued(policy: str) -> float:
        async def scenario(runtime, app):
            replicas = runtime.managers[app.named_unit_tasks()[ENCODER].deployment_key()].replicas
            sent = asyncio.gather(*(first_token_s(runtime, app, r) for r in burst))
            start, idle = time.perf_counter(), 0.0
            while not sent.done():
                await asyncio.sleep(0.002)
                loads = [r.in_flight for r in replicas]
                if min(loads) == 0 and max(loads) > 1:  # one idles while another has calls waiting
                    idle += 0.002
            await sent
            return idle / (time.perf_counter() - start)

        return serving(f"    replica_routing = {{{ENCODER!r}: {policy!r}}}", deployed, scenario)

    by_tokens, by_calls = idle_while_queued("tokens"), idle_while_queued("static")
    assert by_tokens < 0.1, by_tokens
    assert by_calls > 0.4, by_calls


def test_text_requests_meet_their_ttft_slo_during_an_image_burst():
    """Text-only requests arriving behind a burst of 8-image requests are served first at the LLM
    (least slack to their SLO's deadline first) and keep their 0.4 s TTFT; without SLOs they wait
    for the burst's prefills in arrival order."""
    images = [png(700, 700)] * 8  # 625 tokens each: 5000 media tokens a request
    deployed = plan(
        2,
        1,
        {"token_s": 0.000001},  # encoding: 0.6 ms an image
        {
            "token_s": 0.00004,
            "continuous": True,
            "max_batch": 2,
            "items": 3,
            "item_s": 0.005,
        },  # 0.2 s a prefill
    )

    def text_ttfts(config: str) -> list[float]:
        async def scenario(runtime, app):
            burst = [
                asyncio.ensure_future(first_token_s(runtime, app, ChatRequest.of(f"look {i}", images=images)))
                for i in range(8)
            ]
            tasks = app.named_unit_tasks()
            encoders, llm = (runtime.managers[tasks[key].deployment_key()].replicas for key in (ENCODER, LLM))
            # Until its images are encoded and its 1.6 s of prefills queued at the LLM (leased at
            # dispatch, the LLM counts them at once); a fixed wait let a slow host's text go first.
            while sum(r.in_flight for r in encoders) or sum(r.in_flight for r in llm) < len(burst):
                await asyncio.sleep(0.005)
            texts = []
            for i in range(3):
                texts.append(asyncio.ensure_future(first_token_s(runtime, app, ChatRequest.of(f"hello {i}"))))
                await asyncio.sleep(0.05)
            await asyncio.gather(*burst)
            return await asyncio.gather(*texts)

        return serving(config, deployed, scenario)

    slos = '    slos = {"text": {"ttft_s": 0.4}, "image+text": {"ttft_s": 30}}'
    with_slos, fifo = text_ttfts(slos), text_ttfts("")
    assert max(with_slos) <= 0.4, with_slos
    assert min(fifo) > 0.4, fifo  # the burst is real: arrival order misses the SLO


def test_an_llm_picked_by_tokens_is_picked_once_the_images_are_encoded_by_the_load_then():
    """Pull hand-off: the LLM call of an image request takes its replica when its encoder calls are
    done (a replica picked at arrival would have been picked blind to the prompts that came since),
    then fetches the embeddings from the encoder. Here a long and a longer text request arrive while
    its image is encoded: picked then, it goes behind the shorter one and starts as that ends."""
    deployed = plan(1, 2, {"latency_s": 0.3}, {"token_s": 0.0005, "items": 1})  # 0.3 s an image

    def run(policy: str):
        async def scenario(runtime, app):
            llm = runtime.managers[app.named_unit_tasks()[LLM].deployment_key()]
            leased, lease = [], llm.lease

            async def timed_lease(*args, **kwargs):
                leased.append(time.perf_counter())
                return await lease(*args, **kwargs)

            llm.lease = timed_lease
            start = time.perf_counter()
            image = asyncio.ensure_future(
                first_token_s(runtime, app, ChatRequest.of("see", images=[png(280, 280)]))
            )
            await asyncio.sleep(0.01)
            longer = [
                asyncio.ensure_future(first_token_s(runtime, app, ChatRequest.of("x" * 4 * n)))
                for n in (600, 1000)
            ]
            ttft = await image
            await asyncio.gather(*longer)
            return leased[-1] - start if policy == "tokens" else leased[0] - start, ttft

        return serving(f"    replica_routing = {{{LLM!r}: {policy!r}}}", deployed, scenario)

    pulled_at, pulled_ttft = run("tokens")
    assert pulled_at >= 0.3  # leased once its image was encoded
    assert pulled_ttft < 0.45, pulled_ttft  # 0.3 s encoding, then the 600-token prompt's end (0.3 s)
    static_at, _ = run("static")
    assert static_at < 0.05  # request-static routing picks at arrival, with no queries
