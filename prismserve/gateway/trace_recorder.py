"""`prismserve serve --record-trace FILE`: one JSON line per answered chat request, for trace replay.

Each line has the workload format (`prismserve.bench.workloads.read_requests`, `planner.replay.read_trace`):
`arrival_s` (seconds since the gateway started recording), `text_tokens` (whitespace-separated words
of the messages' text: the gateway has no tokenizer, and emulated models size prompts in words too),
`output_tokens` (the answer's tokens as the app reports them, the API's `usage.completion_tokens`: an
answer chunk without a count counts one), `images` ([[width, height], ...]), `audios`, `videos`,
`audio_out`. TriInfer's Algorithm 2 lays instances out by replaying such a trace.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import IO

from prismserve.protocol.chat import ChatRequest


class TraceRecorder:
    """Appends one line per request to a file kept open (line-buffered, so a crash loses no line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] = self.path.open("a", buffering=1)  # OSError: the caller reports it
        self._start = time.monotonic()

    def arrival(self) -> float:
        """Seconds since recording started: a request's `arrival_s`, taken when it arrives."""
        return time.monotonic() - self._start

    def record(self, arrival_s: float, request: ChatRequest, output_tokens: int) -> None:
        """Appends the line of one answered request."""
        row = {
            "arrival_s": round(arrival_s, 6),
            "text_tokens": sum(len(m.text.split()) for m in request.messages),
            "output_tokens": output_tokens,
            "images": [list(_image_size(image.data)) for image in request.images],
            "audios": len(request.audios),
            "videos": len(request.videos),
            "audio_out": request.wants_audio,
        }
        self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        """Closes the file."""
        self._file.close()


def _image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the image's header (the pixels are not decoded)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size
