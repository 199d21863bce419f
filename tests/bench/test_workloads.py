"""Workloads read from ../shared/workloads: distributions, recipes, arrivals, errors."""

from __future__ import annotations

import numpy as np
import pytest

from prismserve.bench.payloads import chat_body
from prismserve.bench.workloads import (
    Arrivals,
    RequestSpec,
    WorkloadError,
    azure,
    controlled,
    image_size,
    mooncake,
    servegen,
    type_mix,
)


def test_any_to_any_recipe_of_000_footnote_6():
    specs = servegen(Arrivals("poisson", 10.0), count=4000, any_to_any=True, seed=3)
    assert all(len(s.images) >= 1 for s in specs)
    assert np.mean([s.videos for s in specs]) == pytest.approx(0.5, abs=0.03)
    assert np.mean([s.audios for s in specs]) == pytest.approx(0.5, abs=0.03)
    assert np.mean([s.audio_out for s in specs]) == pytest.approx(0.2, abs=0.02)
    assert len(type_mix(specs)) == 8  # every input/output combination occurs


def test_servegen_follows_the_published_image_and_output_statistics():
    specs = servegen(Arrivals("poisson", 10.0), count=4000, seed=1)
    counts = np.array([len(s.images) for s in specs])
    # workloads/README.md: 80.1 % one image, mean 1.6; output tokens mean 129.
    assert np.mean(counts == 1) == pytest.approx(0.80, abs=0.05)
    assert counts.mean() == pytest.approx(1.6, abs=0.25)
    assert np.mean([s.output_tokens for s in specs]) == pytest.approx(129, rel=0.15)
    assert all(s.audios == s.videos == 0 and not s.audio_out for s in specs)


def test_poisson_arrivals_have_the_rate_and_trace_arrivals_can_be_rescaled():
    specs = servegen(Arrivals("poisson", 20.0), count=3000, seed=2)
    gaps = np.diff([s.arrival_s for s in specs])
    assert 1 / gaps.mean() == pytest.approx(20.0, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)  # exponential gaps
    traced = servegen(Arrivals("trace", 50.0), count=500, seed=2)
    assert traced[0].arrival_s == 0 and 499 / traced[-1].arrival_s == pytest.approx(50.0, rel=1e-6)


def test_text_traces_keep_their_lengths_and_order():
    conv = azure("conv", Arrivals("trace"), count=3)
    # The first rows of AzureLLMInferenceTrace_conv.csv: (374, 44), (396, 109), 4.3 s apart.
    assert [(s.text_tokens, s.output_tokens) for s in conv[:2]] == [(374, 44), (396, 109)]
    assert conv[1].arrival_s == pytest.approx(4.3145, abs=1e-3)
    first = mooncake("conversation", Arrivals("poisson", 5.0), count=2)
    assert (first[0].text_tokens, first[0].output_tokens) == (6758, 500) and first[0].request_type == "text"


def test_controlled_workload_has_the_expected_images():
    specs = controlled(5.0, (1920, 1080), 0.6, 100, 50, count=2000, seed=4)
    assert np.mean([len(s.images) for s in specs]) == pytest.approx(0.6, abs=0.04)
    assert {s.images for s in specs} == {(), ((1920, 1080),)}
    assert type_mix(specs).keys() == {"text", "image+text"}


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: servegen(Arrivals("poisson", 1.0), count=10, duration=5),
            "either a request count or a duration",
        ),
        (lambda: azure("chat", Arrivals("trace"), count=1), "'conv' and 'code'"),
        (lambda: Arrivals("poisson"), "poisson arrivals need a rate"),
        (lambda: Arrivals("burst", 1.0), "arrivals must be 'poisson' or 'trace'"),
        (lambda: controlled(1.0, (8, 8), -1, 10, 10, count=1), "mean_images ≥ 0"),
    ],
)
def test_bad_workload_parameters_are_clear_errors(call, message):
    with pytest.raises(WorkloadError, match=message):
        call()


def test_request_body_carries_real_media_for_each_part():
    spec = RequestSpec(
        0.0, text_tokens=5, output_tokens=7, images=(image_size(400),), audios=1, videos=1, audio_out=True
    )
    body = chat_body(spec, "m")
    kinds = [part["type"] for part in body["messages"][0]["content"]]
    assert kinds == ["text", "image_url", "input_audio", "video_url"]
    assert len(body["messages"][0]["content"][0]["text"].split()) == 5
    assert body["max_tokens"] == 7 and body["modalities"] == ["text", "audio"]
    assert body["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert spec.request_type == "audio+image+text+video->audio"
