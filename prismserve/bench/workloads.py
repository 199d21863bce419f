"""Workloads: what requests to send and when, from the public traces of the workloads folder.

A workload is a list of `RequestSpec`s (arrival time, text and output lengths, media). Sources:
ServeGen mm-image (per-client field distributions and arrival patterns), the any-to-any recipe of
000 §7.2 footnote 6, Azure LLM 2023 (conv, code), Mooncake (conversation, synthetic) and the
controlled workloads of 000 Table 3. Arrivals are Poisson at a given rate, or the trace's own
timestamps (scaled to a given mean rate when one is given).
"""

from __future__ import annotations

import ast
import csv
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path

import numpy as np

from prismserve.bench import TRACES
from prismserve.errors import WorkloadError

QWEN_PATCH_PIXELS = 28 * 28  # pixels per image token in Qwen-VL models (14-px patches merged 2x2)
CARS_ASPECT = 3394 / 1830  # the aspect ratio of media/cars.jpg, kept when resizing it


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: when it arrives and what it holds."""

    arrival_s: float
    text_tokens: int
    output_tokens: int
    images: tuple[tuple[int, int], ...] = ()  # (width, height) of each image
    audios: int = 0
    videos: int = 0
    audio_out: bool = False

    @property
    def request_type(self) -> str:
        """The type name the server gives this request (ChatRequest.request_type)."""
        kinds = {"text"} | {
            k for k, n in (("image", len(self.images)), ("audio", self.audios), ("video", self.videos)) if n
        }
        name = "+".join(sorted(kinds))
        return f"{name}->audio" if self.audio_out else name


@dataclass(frozen=True)
class Arrivals:
    """How arrival times are made: `poisson` at `rate`, or the trace's own (`trace`), scaled to `rate` if given."""

    kind: str = "poisson"
    rate: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("poisson", "trace"):
            raise WorkloadError(f"arrivals must be 'poisson' or 'trace', got {self.kind!r}")
        if self.kind == "poisson" and not (self.rate and self.rate > 0):
            raise WorkloadError("poisson arrivals need a rate > 0 (requests/s)")
        if self.rate is not None and not self.rate > 0:
            raise WorkloadError(f"rate must be > 0 requests/s, got {self.rate}")


def fetched_dir() -> Path:
    """Where `prismserve workloads fetch` puts the workloads by default: ~/.cache/prismserve/workloads."""
    return Path.home() / ".cache" / "prismserve" / "workloads"


def workloads_dir() -> Path:
    """The workloads folder: $PRISMSERVE_WORKLOADS, else `shared/workloads` beside the working
    directory or the package, or beside one of their parents (a checkout next to ../shared), else
    the one `prismserve workloads fetch` made (`fetched_dir()`)."""
    override = os.environ.get("PRISMSERVE_WORKLOADS")
    if override:
        if not (Path(override) / "README.md").exists():
            raise WorkloadError(
                f"PRISMSERVE_WORKLOADS={override} is not a workloads folder (no README.md there); "
                "fill it with `prismserve workloads fetch`"
            )
        return Path(override)
    starts = [Path.cwd().resolve(), Path(__file__).resolve().parent]
    for start in starts:
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "workloads"
            if (candidate / "README.md").exists():
                return candidate
    if (fetched_dir() / "README.md").exists():
        return fetched_dir()
    raise WorkloadError(
        f"no workloads folder: none in {fetched_dir()} nor a shared/workloads beside "
        f"{[str(s) for s in starts]} or their parents; run `prismserve workloads fetch` "
        "(or set PRISMSERVE_WORKLOADS to a copy)"
    )


def data_file(root: Path | str, path: str) -> Path:
    """`root / path`, or a WorkloadError saying how to fetch it (a fetch with --only can leave groups out)."""
    full = Path(root) / path
    if not full.exists():
        raise WorkloadError(f"{full} is missing; run `prismserve workloads fetch` to fetch it")
    return full


# --- arrival processes -------------------------------------------------------------------------


def poisson_times(
    rng: np.random.Generator, rate: float, count: int | None, duration: float | None
) -> np.ndarray:
    """Arrival times of a Poisson process: `count` of them, or all before `duration` seconds."""
    if count is None:
        assert duration is not None, "give a count or a duration"
        count = int(rate * duration * 1.5 + 50)  # enough to pass `duration`; cut below
    times = np.cumsum(rng.exponential(1.0 / rate, size=count))
    return times[times < duration] if duration is not None else times


def _limit(times: np.ndarray, count: int | None, duration: float | None) -> np.ndarray:
    times = times - times[0] if len(times) else times
    if duration is not None:
        times = times[times < duration]
    return times[:count] if count is not None else times


def scaled_trace_times(
    times: np.ndarray, rate: float | None, count: int | None, duration: float | None
) -> np.ndarray:
    """A trace's arrival times from 0, compressed or stretched to mean `rate`, then cut to `count` / `duration`."""
    times = np.sort(np.asarray(times, dtype=float))
    times = times - times[0]
    if rate is not None and len(times) > 1 and times[-1] > 0:
        # Scale on the part that will be kept, so the kept requests arrive at `rate` on average.
        kept = times[:count] if count is not None else times
        times = times * ((len(kept) - 1) / kept[-1]) / rate if kept[-1] > 0 else times
    return _limit(times, count, duration)


# --- ServeGen -------------------------------------------------------------------------------------


@dataclass
class _Client:
    rate: float  # mean requests/s over the day
    windows: list[tuple[float, float, float, str, float, float]]  # start, rate, cv, pattern, shape, scale
    tables: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = field(
        default_factory=dict
    )  # 6-h slot -> field -> (values, p)

    def sample(self, rng: np.random.Generator, name: str, slot: int, at_least: float = -math.inf) -> int:
        """A value of field `name` in 6-h slot `slot`, conditioned on `>= at_least` (that bound when impossible)."""
        values, p = self.tables[slot][name]
        keep = values >= at_least
        if not keep.any():
            return int(at_least)
        values, p = values[keep], p[keep]
        return int(values[rng.choice(len(values), p=p / p.sum())])


@cache
def _servegen_clients(root: str) -> tuple[_Client, ...]:
    folder = data_file(root, "servegen/mm-image")
    clients = []
    for trace in sorted(folder.glob("chunk-*-trace.csv")):
        dataset = trace.with_name(trace.name.replace("-trace.csv", "-dataset.json"))
        windows = []
        with trace.open() as f:
            for row in csv.reader(f):
                if len(row) >= 6 and row[3]:
                    windows.append(
                        (float(row[0]), float(row[1]), float(row[2]), row[3], float(row[4]), float(row[5]))
                    )
        if not windows or not dataset.exists():
            continue
        tables = {}
        for slot, fields in json.loads(dataset.read_text()).items():
            parsed = {}
            for name, table in fields.items():
                pairs = ast.literal_eval(table)  # stored as a Python-dict string: value -> probability
                values = np.array(list(pairs.keys()), dtype=float)
                p = np.array(list(pairs.values()), dtype=float)
                parsed[name] = (values, p / p.sum())
            tables[int(slot)] = parsed
        rate = sum(w[1] for w in windows) * 600 / 86400
        clients.append(_Client(rate, windows, tables))
    if not clients:
        raise WorkloadError(f"no ServeGen clients under {folder}")
    return tuple(clients)


def _servegen_trace_times(
    clients: tuple[_Client, ...], rng: np.random.Generator, start_s: float, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` arrivals from `start_s` on (and their clients), window by window: each client's
    inter-arrivals follow its Gamma or Weibull fit for that 600 s window."""
    windows = {client: {w[0]: w for w in c.windows} for client, c in enumerate(clients)}
    times: list[float] = []
    owners: list[int] = []
    slot = math.floor(start_s / 600) * 600
    while len(times) < count and slot < start_s + 86400:
        for index in range(len(clients)):
            window = windows[index].get(slot % 86400)
            if window is None:
                continue
            _start, _rate, _cv, pattern, shape, scale = window
            t = max(slot, start_s)
            while True:
                t += max(rng.gamma(shape, scale) if pattern == "Gamma" else scale * rng.weibull(shape), 1e-6)
                if t >= slot + 600:
                    break
                times.append(t)
                owners.append(index)
        slot += 600
    order = np.argsort(times, kind="stable")
    return np.asarray(times)[order][:count], np.asarray(owners, dtype=int)[order][:count]


def image_size(tokens: int) -> tuple[int, int]:
    """A (width, height) with cars.jpg's aspect that a Qwen-VL model turns into about `tokens` tokens."""
    pixels = max(1, tokens) * QWEN_PATCH_PIXELS
    width = max(28, round(math.sqrt(pixels * CARS_ASPECT) / 28) * 28)
    height = max(28, round(pixels / width / 28) * 28)
    return width, height


def servegen(
    arrivals: Arrivals,
    count: int | None = None,
    duration: float | None = None,
    seed: int = 0,
    start_s: float = 0.0,
    root: Path | None = None,
    any_to_any: bool = False,
) -> list[RequestSpec]:
    """ServeGen mm-image requests: clients chosen by rate, fields from their distributions at the time.

    With `any_to_any`, 000 §7.2 footnote 6: every request has at least one image (the true
    distribution, conditioned on ≥ 1), a 50 % chance each of one video and one audio clip, and a
    20 % chance of asking for audio output.
    """
    _check_size(count, duration)
    rng = np.random.default_rng(seed)
    clients = _servegen_clients(str(root or workloads_dir()))
    if arrivals.kind == "poisson":
        assert arrivals.rate is not None  # Arrivals checks that poisson has one
        times = poisson_times(rng, arrivals.rate, count, duration)
        weights = np.array([c.rate for c in clients])
        owners = rng.choice(len(clients), size=len(times), p=weights / weights.sum())
    else:
        raw, owners = _servegen_trace_times(clients, rng, start_s, count or 20_000)
        times = scaled_trace_times(raw, arrivals.rate, count, duration)
        owners = owners[: len(times)]
    specs = []
    for t, owner in zip(times, owners, strict=True):
        client = clients[int(owner)]
        slot = max(s for s in client.tables if s <= (start_s + t) % 86400) if client.tables else 0
        images = client.sample(rng, "image_count", slot, at_least=1 if any_to_any else -math.inf)
        sizes = tuple(image_size(client.sample(rng, "image_tokens", slot)) for _ in range(images))
        specs.append(
            RequestSpec(
                arrival_s=float(t),
                text_tokens=max(1, client.sample(rng, "text_tokens", slot)),
                output_tokens=max(1, client.sample(rng, "output_tokens", slot)),
                images=sizes,
                audios=int(rng.random() < 0.5) if any_to_any else 0,
                videos=int(rng.random() < 0.5) if any_to_any else 0,
                audio_out=bool(rng.random() < 0.2) if any_to_any else False,
            )
        )
    return specs


# --- text traces -----------------------------------------------------------------------------------


def azure(
    trace: str,
    arrivals: Arrivals,
    count: int | None = None,
    duration: float | None = None,
    seed: int = 0,
    root: Path | None = None,
) -> list[RequestSpec]:
    """Azure LLM 2023 (`conv` or `code`): text requests with the trace's input and output lengths."""
    if trace not in ("conv", "code"):
        raise WorkloadError(f"Azure 2023 traces are 'conv' and 'code', not {trace!r}")
    rows = _azure_rows(str(root or workloads_dir()), trace)
    return _text_workload(rows, arrivals, count, duration, seed)


@cache
def _azure_rows(root: str, trace: str) -> tuple[tuple[float, int, int], ...]:
    path = data_file(root, f"azure_llm_2023/AzureLLMInferenceTrace_{trace}.csv")
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            rows.append((stamp, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    return tuple(rows)


def mooncake(
    trace: str,
    arrivals: Arrivals,
    count: int | None = None,
    duration: float | None = None,
    seed: int = 0,
    root: Path | None = None,
) -> list[RequestSpec]:
    """Mooncake (`conversation` or `synthetic`): text requests with the trace's input and output lengths."""
    if trace not in ("conversation", "synthetic"):
        raise WorkloadError(f"Mooncake traces are 'conversation' and 'synthetic', not {trace!r}")
    rows = _mooncake_rows(str(root or workloads_dir()), trace)
    return _text_workload(rows, arrivals, count, duration, seed)


@cache
def _mooncake_rows(root: str, trace: str) -> tuple[tuple[float, int, int], ...]:
    path = data_file(root, f"mooncake/{trace}_trace.jsonl")
    with path.open() as f:
        records = [json.loads(line) for line in f if line.strip()]
    return tuple((r["timestamp"] / 1000, int(r["input_length"]), int(r["output_length"])) for r in records)


def _text_workload(rows, arrivals: Arrivals, count, duration, seed: int) -> list[RequestSpec]:
    _check_size(count, duration)
    rng = np.random.default_rng(seed)
    if arrivals.kind == "poisson":
        assert arrivals.rate is not None  # Arrivals checks that poisson has one
        times = poisson_times(rng, arrivals.rate, count, duration)
        picked = [rows[i % len(rows)] for i in range(len(times))]  # the trace's lengths, in order
    else:
        times = scaled_trace_times(np.array([r[0] for r in rows]), arrivals.rate, count, duration)
        picked = list(rows[: len(times)])
    return [RequestSpec(float(t), max(1, r[1]), max(1, r[2])) for t, r in zip(times, picked, strict=True)]


def trace(
    name: str, arrivals: Arrivals, count: int | None = None, duration: float | None = None, seed: int = 0
) -> list[RequestSpec]:
    """The requests of a trace workload by its name (`TRACES`, as `prismserve bench --workload` and
    `prismserve profile --workload` name them)."""
    if name in ("any2any", "servegen"):
        return servegen(arrivals, count, duration, seed, any_to_any=name == "any2any")
    if name.startswith("azure-"):
        return azure(name.removeprefix("azure-"), arrivals, count, duration, seed)
    if name.startswith("mooncake-"):
        return mooncake(name.removeprefix("mooncake-"), arrivals, count, duration, seed)
    raise WorkloadError(f"unknown workload {name!r}: one of {', '.join(TRACES)}")


# --- controlled (000 Table 3) -----------------------------------------------------------------------


def controlled(
    rate: float,
    resolution: tuple[int, int],
    mean_images: float,
    input_tokens: int,
    output_tokens: int,
    count: int | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> list[RequestSpec]:
    """Poisson arrivals of identical-shape requests; `mean_images` = ⌊m⌋ images plus one more with probability m − ⌊m⌋."""
    _check_size(count, duration)
    if mean_images < 0 or input_tokens < 1 or output_tokens < 1:
        raise WorkloadError("controlled workload: mean_images ≥ 0 and token counts ≥ 1")
    rng = np.random.default_rng(seed)
    times = poisson_times(rng, rate, count, duration)
    whole, extra = int(mean_images), mean_images - int(mean_images)
    return [
        RequestSpec(
            float(t), input_tokens, output_tokens, images=(resolution,) * (whole + int(rng.random() < extra))
        )
        for t in times
    ]


def _check_size(count: int | None, duration: float | None) -> None:
    if (count is None) == (duration is None):
        raise WorkloadError("give either a request count or a duration")
    if count is not None and count < 1:
        raise WorkloadError(f"request count must be ≥ 1, got {count}")
    if duration is not None and not duration > 0:
        raise WorkloadError(f"duration must be > 0 s, got {duration}")


def type_mix(specs: list[RequestSpec]) -> dict[str, float]:
    """The share of each request type in a workload."""
    counts: dict[str, int] = {}
    for spec in specs:
        counts[spec.request_type] = counts.get(spec.request_type, 0) + 1
    return {t: n / len(specs) for t, n in sorted(counts.items())}


# --- workload files --------------------------------------------------------------------------------


def read_requests(path: Path | str) -> list[RequestSpec]:
    """A workload written as JSON lines, one request each: `text_tokens`, `output_tokens`, and optionally
    `arrival_s`, `images` ([[width, height], ...]), `audios`, `videos`, `audio_out`."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    specs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            row["images"] = tuple(tuple(size) for size in row.get("images", ()))
            specs.append(RequestSpec(**{"arrival_s": 0.0, **row}))
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise WorkloadError(f"{path}:{number}: not a request ({exc})") from None
    if not specs:
        raise WorkloadError(f"{path}: holds no request")
    return specs


def write_requests(specs: list[RequestSpec], path: Path | str) -> None:
    """`specs` as a workload file (`read_requests`)."""
    rows = [json.dumps({**vars(s), "images": [list(size) for size in s.images]}) for s in specs]
    Path(path).write_text("\n".join(rows) + "\n")
