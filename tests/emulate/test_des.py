"""The cluster simulator: vLLM's step loop per instance, decoupled encoders, ModServe's policies."""

from __future__ import annotations

import random

import pytest

from prismserve.emulate.des import Cluster, EncoderCosts, Request, StageScaling, simulate_cluster
from prismserve.executors.sim_engine import SimRequest, StepCosts, simulate

COSTS = StepCosts(
    step_s=0.005,
    prefill_token_s=0.0002,
    decode_seq_s=0.0005,
    context_token_s=1e-7,
    max_num_batched_tokens=512,
)
ENCODER = EncoderCosts(s_per_token=0.0001, batch_s=0.002, max_batch=4, tp_speedup={4: 2.0})


def _requests(count: int, seed: int, rate: float = 20.0, images: int = 3) -> list[Request]:
    draw = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += draw.expovariate(rate)
        image_tokens = tuple(draw.choice((256, 1280)) for _ in range(draw.randint(0, images)))
        text = draw.randint(20, 600)
        out.append(Request(t, text, draw.randint(1, 40), image_tokens, llm_tokens=text + sum(image_tokens)))
    return out


def test_the_monolith_on_one_instance_reproduces_the_engines_own_timelines():
    requests = _requests(120, seed=1)
    simulated = simulate_cluster(Cluster(llm=COSTS, llms=1, encoder=ENCODER), requests).requests
    engine = simulate(
        COSTS,
        [
            (
                r.arrival,
                SimRequest(
                    r.llm_tokens,
                    r.output_tokens,
                    ENCODER.seconds(sum(r.image_tokens), 4) if r.image_tokens else 0.0,
                ),
            )
            for r in requests
        ],
    )
    assert any(r.image_tokens for r in requests) and len(engine) == len(simulated)
    for ours, theirs in zip(simulated, engine, strict=True):
        assert ours.tokens == pytest.approx(theirs.tokens, abs=1e-12)


def test_fan_out_encodes_a_many_image_request_sooner_than_one_encoder():
    def encoded(fan_out: bool) -> float:
        request = Request(0.0, 10, 1, (1280,) * 8, llm_tokens=10 + 8 * 1280)
        cluster = Cluster(llm=COSTS, llms=1, encoder=ENCODER, encoders=8, fan_out=fan_out, token_routing=True)
        simulate_cluster(cluster, [request])
        assert request.encoded_at is not None
        return request.encoded_at

    one = ENCODER.seconds(8 * 1280)  # all eight images in one call
    assert encoded(False) == pytest.approx(one)
    assert encoded(True) == pytest.approx(ENCODER.seconds(1280))  # one image on each encoder
    assert encoded(True) < one / 4


def test_token_aware_routing_balances_the_tokens_each_llm_prefills():
    # Alternating huge and tiny text requests: counting requests sends every huge one to one LLM.
    requests = [
        Request(i * 0.001, 4000 if i % 2 == 0 else 10, 1, llm_tokens=4000 if i % 2 == 0 else 10)
        for i in range(40)
    ]

    def spread(token_routing: bool) -> float:
        fresh = [Request(r.arrival, r.text_tokens, 1, llm_tokens=r.llm_tokens) for r in requests]
        cluster = Cluster(llm=COSTS, llms=2, encoder=ENCODER, encoders=1, token_routing=token_routing)
        run = simulate_cluster(cluster, fresh)
        return max(r.ttft for r in run.requests)

    balanced = 20 * (COSTS.step_s * 8 + 4000 * COSTS.prefill_token_s) / 2  # half the huge prefills each
    assert spread(True) == pytest.approx(balanced, rel=0.1)
    assert spread(True) < 0.8 * spread(False)


def test_text_only_requests_never_wait_for_the_encoders():
    image = Request(0.0, 10, 1, (1280,) * 16, llm_tokens=10 + 16 * 1280)
    text = Request(0.001, 10, 1, llm_tokens=10)
    cluster = Cluster(llm=COSTS, llms=1, encoder=ENCODER, encoders=1)
    simulate_cluster(cluster, [image, text])
    assert text.ttft < 0.05 < image.ttft  # on the monolith it would wait behind 16 images' encoding


def test_least_slack_first_at_the_encoder_serves_the_tight_request_first():
    def ttft_of_tight(slo: bool) -> float:
        big = [Request(0.0, 10, 1, (1280,) * 4, llm_tokens=10, ttft_slo_s=100.0) for _ in range(3)]
        tight = Request(0.0001, 10, 1, (256,), llm_tokens=10, ttft_slo_s=0.05)
        encoder = EncoderCosts(s_per_token=0.0001, max_batch=1)
        cluster = Cluster(llm=COSTS, llms=1, encoder=encoder, encoders=1, slo_scheduling=slo)
        simulate_cluster(cluster, [*big, tight])
        return tight.ttft

    assert ttft_of_tight(True) < ttft_of_tight(False) / 2


def test_pd_disaggregation_hands_the_kv_cache_to_a_decode_instance():
    request = Request(0.0, 100, 5, llm_tokens=100)
    cluster = Cluster(
        llm=COSTS, llms=1, encoder=ENCODER, encoders=1, decode=COSTS, decodes=1, kv_transfer_s=0.01
    )
    simulate_cluster(cluster, [request])
    assert request.ttft == pytest.approx(COSTS.step_s + 100 * COSTS.prefill_token_s)
    gap = request.tokens[1] - request.tokens[0]
    assert gap == pytest.approx(0.01 + COSTS.step_s + COSTS.decode_seq_s + 100 * COSTS.context_token_s)
    assert len(request.tokens) == 5


def test_autoscaling_follows_a_burst_and_counts_gpu_seconds_exactly():
    quiet = [Request(i * 0.5, 50, 2, llm_tokens=50) for i in range(40)]
    burst = [Request(20.0 + i * 0.01, 50, 2, (1280,) * 4, llm_tokens=50 + 5120) for i in range(400)]
    scale = StageScaling(interval_s=2.0, window_s=2.0, target_utilization=0.5, max_gpus=64)
    cluster = Cluster(llm=COSTS, llms=1, encoder=ENCODER, encoders=1, autoscale=scale)
    run = simulate_cluster(cluster, quiet + burst)
    peak = max(t[1]["encoder"] for t in run.gpu_timeline)
    assert peak > 1 and run.gpu_timeline[-1][1]["encoder"] < peak  # up for the burst, down after
    # GPU-seconds: at least the active GPUs integrated over the timeline (draining ones add to it).
    points = [*run.gpu_timeline, (run.now, run.gpu_timeline[-1][1])]
    active = sum(sum(a[1].values()) * (b[0] - a[0]) for a, b in zip(points, points[1:], strict=False))
    assert active > 0 and run.gpu_s >= active - 1e-9
    assert run.gpu_s <= 64 * run.now


def test_a_static_cluster_holds_all_its_gpus_for_the_whole_run():
    requests = _requests(50, seed=3)
    cluster = Cluster(llm=COSTS, llms=2, encoder=ENCODER, encoders=3)
    run = simulate_cluster(cluster, requests)
    assert run.gpu_s == pytest.approx((2 * 4 + 3) * max(r.tokens[-1] for r in run.requests))
