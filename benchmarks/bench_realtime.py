"""A realtime session on a served Omni model, through the official `openai` client: a spoken turn,
then barge-in, timed.

The model: the tiny random-weight Qwen2.5-Omni of `prismserve tiny` (or `--family qwen3-omni`), served
with no app file on one declared GPU (`prismserve serve DIR --fake-gpus 1`: its five components share
it, each in a replica of its own), or the server at `--url`. Per round, on one `/v1/realtime` session
with server-side turn detection (silero-vad; 1.5 s of silence ends a turn, as the clip has a pause):
  turn      the workloads' spoken query (query_to_cars.wav at 24 kHz) and 2 s of silence appended as
            a microphone sends it (100 ms pieces, sent at once): the turn is detected, committed and
            answered with text and speech. Timed from `speech_stopped` to the first transcript and
            the first audio delta, and to `response.done` (with its usage); the CPU seconds the
            talker's and the vocoder's replicas used for the whole answer.
  barge-in  a text question answered aloud; once its first audio delta is here, the clip is spoken
            again. Timed from the first piece of that speech sent to `speech_started`, from
            `speech_started` to `response.done` (status `cancelled`), and from `response.done`
            until the talker's and the vocoder's replicas are idle (their processes use under a
            quarter of a core over 200 ms; read from /proc, so the server must run on this machine),
            with the CPU seconds they used meanwhile: work a load slows down but does not add to, to
            set beside the turn's; audio deltas after `speech_started` are counted (0 expected).
Medians over `--rounds` rounds are printed.
Run: python benchmarks/bench_realtime.py [--family qwen2.5-omni|qwen3-omni] [--rounds 3] [--out result.json]
     [--url URL --model NAME --admin-token TOKEN]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
from bench_omni import process_cpu

import prismserve  # noqa: F401  (telemetry off)

RATE = 24_000  # the session's audio: 16-bit mono PCM at 24 kHz
PIECE = RATE // 10 * 2  # bytes in 100 ms of it
SPEAKING_STAGES = ("TalkerTask", "VocoderTask")
IDLE_DEADLINE_S = 30.0
WINDOW_S = 0.2  # the CPU meter's window
IDLE_CORES = 0.25  # below this, over a window, the talker and vocoder are idle


def speech() -> bytes:
    """The workloads' spoken query as the session's input audio."""
    from prismserve.bench.workloads import workloads_dir
    from prismserve.gateway.media import AudioStreamEncoder, decode_audio

    pcm, rate = decode_audio((workloads_dir() / "media" / "query_to_cars.wav").read_bytes(), "clip")
    encoder = AudioStreamEncoder("pcm", RATE)
    return encoder.feed(pcm, rate) + encoder.finish()


def speak(connection: Any, pcm: bytes) -> None:
    """Append `pcm` in 100 ms pieces, as a microphone sends them."""
    for at in range(0, len(pcm), PIECE):
        connection.input_audio_buffer.append(audio=base64.b64encode(pcm[at : at + PIECE]).decode())


def events_until(connection: Any, kind: str) -> list[tuple[float, Any]]:
    """(arrival time, event) up to and with the first event of type `kind`."""
    events: list[tuple[float, Any]] = []
    while not events or events[-1][1].type != kind:
        event = connection.recv()
        events.append((time.perf_counter(), event))
    return events


def first(events: list[tuple[float, Any]], kind: str) -> float:
    """The arrival time of the first event of type `kind`."""
    return next(at for at, event in events if event.type == kind)


def spoken_turn(connection: Any, clip: bytes, pids: dict[str, list[int]]) -> dict[str, Any]:
    """The clip spoken and then silence: the detected turn's answer, timed from the end of speech,
    and the CPU seconds its speech took."""
    before = stage_cpu(pids)
    speak(connection, clip + bytes(2 * RATE * 2))
    events = events_until(connection, "response.done")
    used = stage_cpu(pids)
    stopped = first(events, "input_audio_buffer.speech_stopped")
    done = events[-1][1].response
    audio = b"".join(base64.b64decode(e.delta) for _, e in events if e.type == "response.output_audio.delta")
    transcript = "".join(e.delta for _, e in events if e.type == "response.output_audio_transcript.delta")
    return {
        "kinds": [e.type for _, e in events],
        "status": done.status,
        "usage": {"input_tokens": done.usage.input_tokens, "output_tokens": done.usage.output_tokens},
        "transcript": transcript,
        "audio_s": len(audio) / 2 / RATE,
        "first_transcript_s": first(events, "response.output_audio_transcript.delta") - stopped,
        "first_audio_s": first(events, "response.output_audio.delta") - stopped,
        "done_s": events[-1][0] - stopped,
        **{f"{stage}_cpu_s": used[stage] - before[stage] for stage in pids},
    }


def speaking_pids(url: str, token: str) -> dict[str, list[int]]:
    """The processes of the talker's and the vocoder's replicas (`/admin/status`), by stage."""
    status = httpx.get(f"{url}/admin/status", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    status.raise_for_status()
    pids: dict[str, list[int]] = {stage: [] for stage in SPEAKING_STAGES}
    for key, deployment in status.json()["deployments"].items():
        stage = key.split(":")[0].rsplit(".", 1)[-1]
        if stage in pids:
            pids[stage] += [replica["pid"] for replica in deployment["replicas"] if "pid" in replica]
    return pids


def stage_cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds each stage's processes have used so far."""
    return {stage: process_cpu(each) for stage, each in pids.items()}


def cpu_shares(pids: dict[str, list[int]], window_s: float = WINDOW_S) -> dict[str, float]:
    """Cores each stage's processes used over the next `window_s` seconds."""
    before = stage_cpu(pids)
    time.sleep(window_s)
    return {stage: (cores - before[stage]) / window_s for stage, cores in stage_cpu(pids).items()}


def idle_after(pids: dict[str, list[int]], since: float) -> dict[str, float]:
    """Seconds from `since` until each stage went idle for good: the end of its last busy window
    before a window in which every stage was idle."""
    last_busy = dict.fromkeys(pids, since)
    while True:
        shares = cpu_shares(pids)
        now = time.perf_counter()
        busy = [stage for stage, cores in shares.items() if cores > IDLE_CORES]
        if not busy:
            return {stage: at - since for stage, at in last_busy.items()}
        last_busy.update(dict.fromkeys(busy, now))
        if now - since > IDLE_DEADLINE_S:
            raise RuntimeError(f"{', '.join(busy)} still work {IDLE_DEADLINE_S} s after the cancel")


def barge_in(connection: Any, clip: bytes, pids: dict[str, list[int]]) -> dict[str, Any]:
    """A spoken answer interrupted by the user speaking: how soon it ends, and its work with it."""
    question = {"type": "input_text", "text": "Tell me a long story about cars."}
    connection.conversation.item.create(item={"type": "message", "role": "user", "content": [question]})
    connection.response.create()
    answering = events_until(connection, "response.output_audio.delta")
    busy = cpu_shares(pids)  # the talker and vocoder at work, seen by the same meter as below
    spoke = time.perf_counter()
    speak(connection, clip)  # no silence after it: a barge-in, not a turn to answer yet
    events = events_until(connection, "response.done")
    started = first(events, "input_audio_buffer.speech_started")
    kinds = [e.type for _, e in events]
    after = kinds[kinds.index("input_audio_buffer.speech_started") :]
    cancelled = stage_cpu(pids)
    idle = idle_after(pids, time.perf_counter())
    used = stage_cpu(pids)
    return {
        "answering": [e.type for _, e in answering],
        "status": events[-1][1].response.status,
        "busy_cores": busy,
        "audio_deltas_after_speech": after.count("response.output_audio.delta"),
        "speech_started_s": started - spoke,
        "cancelled_s": events[-1][0] - started,
        **{f"{stage}_idle_after_done_s": seconds for stage, seconds in idle.items()},
        **{f"{stage}_cpu_after_done_s": used[stage] - cancelled[stage] for stage in pids},
    }


def session(url: str, model: str, rounds: int, token: str) -> list[dict[str, Any]]:
    """`rounds` rounds of a spoken turn and a barge-in on one session of `model` at `url` (a server on
    this machine: its replicas' CPU use is read; `token`: its admin token)."""
    import openai

    clip = speech()
    pids = speaking_pids(url, token)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    results = []
    with client.realtime.connect(model=model) as connection:
        assert connection.recv().type == "session.created"
        # Server-side turn detection; 1.5 s of silence ends a turn (the clip has a 1.25 s pause).
        detect: Any = {"type": "server_vad", "silence_duration_ms": 1500}
        connection.session.update(
            session={
                "type": "realtime",
                "max_output_tokens": 16,
                "audio": {"input": {"turn_detection": detect}},
            }
        )
        assert connection.recv().type == "session.updated"
        for _ in range(rounds):
            results.append(
                {"turn": spoken_turn(connection, clip, pids), "barge_in": barge_in(connection, clip, pids)}
            )
    return results


@contextlib.contextmanager
def served(family: str) -> Iterator[tuple[str, str, str]]:
    """`prismserve serve` of the tiny `family` on one declared GPU: (its URL, the model's name, its
    admin token)."""
    import secrets

    from prismserve.models import tiny

    model = tiny.build(family)
    token = secrets.token_hex(8)
    # Declared GPUs: the replicas run on the CPU.
    env = {**os.environ, "PRISMSERVE_DEVICE": "cpu", "PRISMSERVE_ADMIN_TOKEN": token}
    command = [sys.executable, "-m", "prismserve", "serve", str(model), "--fake-gpus", "1", "--port", "0"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line.startswith("prismserve: serving app "):
            raise SystemExit(f"the server did not start (exit {process.wait()}): see its log above")
        yield line.rsplit(" ", 1)[1].strip(), model.name, token
    finally:
        process.terminate()
        process.wait(timeout=120)


def summary(results: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over rounds of every timed figure."""
    figures = {}
    for part in ("turn", "barge_in"):
        for key in results[0][part]:
            if key.endswith("_s"):
                figures[f"{part}.{key}"] = statistics.median(r[part][key] for r in results)
    return figures


def main() -> None:
    from prismserve.offline import go_offline

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", choices=["qwen2.5-omni", "qwen3-omni"], default="qwen2.5-omni")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="a running server to use (with --model) instead of starting one")
    parser.add_argument("--model", help="the app's name on the server at --url")
    parser.add_argument("--admin-token", help="the admin token of the server at --url")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    if args.url and not (args.model and args.admin_token):
        parser.error(
            "--url needs --model and --admin-token (the replicas' processes come from /admin/status)"
        )
    if args.url:
        results = session(args.url, args.model, args.rounds, args.admin_token)
    else:
        go_offline()  # the tiny checkpoint is built here: never reach the hub
        with served(args.family) as (url, model, token):
            results = session(url, model, args.rounds, token)
    figures = summary(results)
    for key, value in figures.items():
        print(f"{key:<40} {value:8.3f} s")
    print("cancelled:", [r["barge_in"]["status"] for r in results])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rounds": results, "medians": figures}, f, indent=2)


if __name__ == "__main__":
    main()
