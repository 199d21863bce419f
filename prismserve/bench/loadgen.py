"""The open-loop load generator: sends a workload's requests at their arrival times, whatever the server does.

Each request is one `POST /v1/chat/completions`; with streaming, the time of every SSE event that
carries text or audio is kept, for time to first token and time between tokens.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from prismserve.bench.payloads import encoded_body
from prismserve.bench.workloads import RequestSpec, workloads_dir


@dataclass
class RequestResult:
    """What happened to one request (times in seconds from the start of the run)."""

    request_type: str
    arrival_s: float
    sent_s: float = 0.0
    done_s: float = 0.0
    ok: bool = False
    status: int = 0
    error: str = ""
    token_s: list[float] = field(default_factory=list)  # time of each streamed text/audio event

    @property
    def latency_s(self) -> float:
        """Send to last byte."""
        return self.done_s - self.sent_s

    @property
    def ttft_s(self) -> float | None:
        """Send to the first streamed text or audio."""
        return self.token_s[0] - self.sent_s if self.token_s else None

    def to_json(self) -> dict:
        """The result as plain JSON."""
        return {
            "type": self.request_type,
            "arrival_s": round(self.arrival_s, 6),
            "sent_s": round(self.sent_s, 6),
            "done_s": round(self.done_s, 6),
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "token_s": [round(t, 6) for t in self.token_s],
        }


class Progress:
    """A one-line progress bar on stderr: sent, done, failed, completion rate."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total, self.enabled = total, enabled
        self.sent = self.done = self.failed = 0
        self._start = time.perf_counter()
        self._shown = 0.0
        self._tty = sys.stderr.isatty()

    def update(self, force: bool = False) -> None:
        """Redraw at most twice a second (every 10 % when stderr is not a terminal)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._tty:
            if not force and now - self._shown < 0.5:
                return
        elif not force and (self.done + self.failed) * 10 // self.total == self._shown:
            return
        self._shown = now if self._tty else (self.done + self.failed) * 10 // self.total
        finished = self.done + self.failed
        bar = "#" * (30 * finished // self.total)
        line = (
            f"[{bar:<30}] {finished}/{self.total} done ({self.failed} failed), {self.sent} sent, "
            f"{finished / max(now - self._start, 1e-9):.1f} req/s"
        )
        print("\r" + line if self._tty else line, end="" if self._tty else "\n", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Final line."""
        if self.enabled:
            self.update(force=True)
            if self._tty:
                print(file=sys.stderr)


async def run_load(
    url: str,
    model: str,
    specs: list[RequestSpec],
    *,
    api_key: str | None = None,
    stream: bool = True,
    timeout_s: float = 900.0,
    progress: bool = True,
    media_root: Path | None = None,
    start: float | None = None,
) -> list[RequestResult]:
    """Send every request of `specs` at its arrival time (open loop); one result per request, in order.

    Times count from `start` (a `time.perf_counter()` reading: a caller timing its own events
    against the results), by default from when the request bodies are built."""
    media_root = media_root or workloads_dir()  # found once, not per request
    bodies = [
        encoded_body(spec, model, stream, media_root) for spec in specs
    ]  # built before the clock starts
    results = [RequestResult(spec.request_type, spec.arrival_s) for spec in specs]
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    bar = Progress(len(specs), progress)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, limits=limits) as client:
        zero = time.perf_counter() if start is None else start

        async def one(index: int) -> None:
            result = results[index]
            delay = zero + result.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            result.sent_s = time.perf_counter() - zero
            bar.sent += 1
            try:
                async with client.stream("POST", "/v1/chat/completions", content=bodies[index]) as response:
                    result.status = response.status_code
                    if response.status_code != 200:
                        result.error = (await response.aread()).decode(errors="replace")[:300]
                    elif stream:
                        await _read_events(response, result, zero)
                    else:
                        await response.aread()
                        result.token_s.append(time.perf_counter() - zero)
                    result.ok = response.status_code == 200 and not result.error
            except httpx.HTTPError as exc:
                result.error = f"{type(exc).__name__}: {exc}"[:300]
            result.done_s = time.perf_counter() - zero
            if result.ok:
                bar.done += 1
            else:
                bar.failed += 1
            bar.update()

        await asyncio.gather(*(one(i) for i in range(len(specs))))
    bar.close()
    return results


async def _read_events(response: httpx.Response, result: RequestResult, start: float) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            result.error = str(event["error"])[:300]
            break
        for choice in event.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("content") or delta.get("audio"):
                result.token_s.append(time.perf_counter() - start)
