"""How steady this host's own speed is: a fixed piece of pure-Python work timed over and over on
each core at once, and its median time in each one-second window.

The twin check (`twin.py`) holds its sim twin to P50 15 % and P99 30 % of the real engines; a host
whose speed moves by more than that from one second to the next moves the real engines with it,
and the real deployment then misses those bounds against its own run seconds later. This reads the
host alone: run it with nothing else running (`twin.py` reads it before each of its runs).
Run: python benchmarks/host_pace.py [--seconds 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any

WINDOW_S = 1.0


def unit() -> int:
    """The fixed piece of work: about 10 ms of one core on this machine at its fastest."""
    total = 0
    for i in range(200_000):
        total += i * i
    return total


def windows(core: int, seconds: float) -> list[float]:
    """On `core` alone, the median seconds of `unit` in each whole `WINDOW_S` of `seconds`."""
    os.sched_setaffinity(0, {core})
    out: list[float] = []
    for _ in range(max(1, int(seconds / WINDOW_S))):
        times: list[float] = []
        end = time.perf_counter() + WINDOW_S
        while not times or time.perf_counter() < end:
            began = time.perf_counter()
            unit()
            times.append(time.perf_counter() - began)
        out.append(statistics.median(times))
    return out


def pace(seconds: float = 20.0) -> dict[str, Any]:
    """Each core's window medians (ms) and its slowest window over its fastest, read at once on
    every core of the host (in a process of its own each: one Python thread per core)."""
    cores = list(range(os.cpu_count() or 1))
    with multiprocessing.get_context("spawn").Pool(len(cores)) as pool:
        read = pool.starmap(windows, [(core, seconds) for core in cores])
    return {
        "window_s": WINDOW_S,
        "cores": {
            str(core): {
                "window_ms": [round(w * 1e3, 2) for w in medians],
                "median_ms": round(statistics.median(medians) * 1e3, 2),
                "slowest_over_fastest": round(max(medians) / min(medians), 2),
            }
            for core, medians in zip(cores, read, strict=True)
        },
    }


def line(reading: dict[str, Any]) -> str:
    """One line: each core's median window and slowest over fastest."""
    return "; ".join(
        f"core {core}: {c['median_ms']:.1f} ms a unit (median window), slowest window / fastest "
        f"{c['slowest_over_fastest']:.2f}"
        for core, c in reading["cores"].items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds to read, one window a second")
    parser.add_argument("--out", type=Path, help="write the reading as JSON here")
    args = parser.parse_args()
    reading = pace(args.seconds)
    print(line(reading))
    if args.out:
        args.out.write_text(json.dumps(reading, indent=2))


if __name__ == "__main__":
    main()
