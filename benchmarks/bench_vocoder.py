"""The Omni vocoders alone: streaming decode (`vocoder_stream`) vs the whole utterance at once.

The models: tiny random-weight Qwen2.5-Omni (token2wav: DiT + BigVGAN) and Qwen3-Omni (code2wav) of
`prismserve tiny` (real transformers code, CPU). Each utterance is `--codes` codes (Qwen3-Omni: frames)
of random ids; the talker's pace is not simulated: codes are pushed in the talker's chunks of 25 as
fast as the decoder takes them, so the figures are the vocoder's own. For 1, 4 and 8 utterances
decoded at once (`--at-once`; one thread each, as the vocoder executor runs them), `--rounds` rounds
in which the modes take turns:
  streamed  codes pushed 25 at a time, audio handed out as each push completes some
  whole     `vocode` on all the codes once they are there (the path before streaming)
Reported per family and concurrency, medians over rounds: time to the first audio packet (from the
first code pushed), real-time factor (decode time / seconds of audio, per utterance), and the
ratios streamed / whole.
Run: python benchmarks/bench_vocoder.py [--codes 250] [--rounds 3] [--at-once 1 4 8] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import prismserve  # noqa: F401  (telemetry off)
from prismserve.models import adapter_for, tiny
from prismserve.offline import go_offline

RATE = 24_000  # audio samples per second
PUSH = 25  # codes per push: the talker's chunk


def utterances(adapter: Any, family: str, count: int, codes: int) -> list[list[Any]]:
    """`count` utterances of random codes the vocoder takes."""
    rng = np.random.default_rng(0)
    if family == "qwen3-omni":
        config = adapter.model.config.code2wav_config
        return [
            rng.integers(0, config.codebook_size, (codes, config.num_quantizers)).tolist()
            for _ in range(count)
        ]
    vocab = adapter.model.config.token2wav_config.dit_config.num_embeds
    return [rng.integers(0, vocab - 5, codes).tolist() for _ in range(count)]


def streamed(adapter: Any, speaker: str, codes: list[Any]) -> tuple[float, float, int]:
    """Time to the first audio, total time and samples of one streamed utterance."""
    stream = adapter.vocoder_stream(speaker, 0)
    start = time.perf_counter()
    first = None
    samples = 0
    for at in range(0, len(codes), PUSH):
        samples += len(stream.push(codes[at : at + PUSH]))
        if samples and first is None:
            first = time.perf_counter() - start
    samples += len(stream.finish())
    total = time.perf_counter() - start
    return first or total, total, samples


def whole(adapter: Any, speaker: str, codes: list[Any]) -> tuple[float, float, int]:
    """Time to the first audio (all of it at once), total time and samples of one utterance."""
    start = time.perf_counter()
    samples = len(adapter.vocode(codes, speaker, 0))
    total = time.perf_counter() - start
    return total, total, samples


def round_of(decode: Any, adapter: Any, speaker: str, batch: list[list[Any]]) -> dict[str, float]:
    """`batch` decoded at once, one thread each: median first-audio time and real-time factor."""
    with ThreadPoolExecutor(len(batch)) as pool:
        results = list(pool.map(lambda codes: decode(adapter, speaker, codes), batch))
    return {
        "first_audio_s": statistics.median(r[0] for r in results),
        "rtf": statistics.median(r[1] / (r[2] / RATE) for r in results),
    }


def measure(codes: int, rounds: int, at_once: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for family in ("qwen2.5-omni", "qwen3-omni"):
        adapter = adapter_for(str(tiny.build(family)))
        adapter.load_vocoder()
        speaker = adapter.speaker(None)
        for concurrent in at_once:
            batch = utterances(adapter, family, concurrent, codes)
            round_of(streamed, adapter, speaker, batch[:1])  # warm-up
            runs: dict[str, list[dict[str, float]]] = {"streamed": [], "whole": []}
            for _ in range(rounds):
                for mode, decode in (("streamed", streamed), ("whole", whole)):
                    runs[mode].append(round_of(decode, adapter, speaker, batch))
            row = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
            row["streamed/whole"] = {
                k: statistics.median(
                    a[k] / b[k] for a, b in zip(runs["streamed"], runs["whole"], strict=True)
                )
                for k in ("first_audio_s", "rtf")
            }
            results[f"{family} x{concurrent}"] = row
            s, w, r = row["streamed"], row["whole"], row["streamed/whole"]
            print(
                f"{family:<13} {concurrent} at once: first audio {s['first_audio_s']:.3f} s vs "
                f"{w['first_audio_s']:.3f} s ({r['first_audio_s']:.2f}x), RTF {s['rtf']:.3f} vs "
                f"{w['rtf']:.3f} ({r['rtf']:.2f}x)",
                flush=True,
            )
    return results


def main() -> None:
    go_offline()  # the tiny checkpoints are built here: never reach the hub
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--codes", type=int, default=250, help="codes per utterance (Qwen2.5-Omni: 5 s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--at-once", type=int, nargs="+", default=[1, 4, 8], help="utterances decoded at once"
    )
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = measure(args.codes, args.rounds, args.at_once)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
