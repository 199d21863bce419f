"""`prismserve bench`: load a running gateway with a workload and report throughput and latency."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from prismserve.bench import TRACES

WORKLOADS = (*TRACES, "controlled")


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    """Register `prismserve bench` on the CLI's subparsers."""
    bench = sub.add_parser(
        "bench",
        help="open-loop load test of a running gateway with a real or controlled workload",
        description="Send a workload to /v1/chat/completions at its arrival times and report throughput, "
        "latency (overall and per request type), TTFT, time between tokens and goodput. "
        "`prismserve bench paper` reruns the papers' experiments instead (`prismserve bench paper --help`).",
    )
    bench.add_argument("--url", default=os.environ.get("PRISMSERVE_URL", "http://127.0.0.1:8000"))
    bench.add_argument("--model", required=True, help="the app to send requests to")
    bench.add_argument(
        "--api-key",
        default=os.environ.get("PRISMSERVE_API_KEY"),
        help="bearer token, if the gateway needs one",
    )
    bench.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="any2any",
        help="default: any2any (the Cornserve paper's any-to-any recipe, §7.2 footnote 6)",
    )
    size = bench.add_mutually_exclusive_group(required=True)
    size.add_argument("--requests", type=int, help="send this many requests")
    size.add_argument("--duration", type=float, help="send requests arriving within this many seconds")
    bench.add_argument(
        "--arrivals", choices=["poisson", "trace"], default="poisson", help="default: poisson (needs --rate)"
    )
    bench.add_argument(
        "--rate", type=float, help="mean requests/s (trace arrivals are scaled to it when given)"
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--warmup", type=int, default=0, help="leave the first N requests out of the metrics")
    bench.add_argument(
        "--no-stream", action="store_true", help="ask for whole answers instead of SSE streams"
    )
    bench.add_argument(
        "--resolution", default="1920x1080", help="controlled: image size WxH (default 1920x1080)"
    )
    bench.add_argument(
        "--images", type=float, default=1.0, help="controlled: mean images per request (default 1.0)"
    )
    bench.add_argument(
        "--input-tokens", type=int, default=1000, help="controlled: text tokens in (default 1000)"
    )
    bench.add_argument("--output-tokens", type=int, default=300, help="controlled: tokens out (default 300)")
    bench.add_argument("--slo-latency", type=float, help="goodput: request latency limit (s)")
    bench.add_argument("--slo-ttft", type=float, help="goodput: time to first token limit (s)")
    bench.add_argument("--slo-tbt", type=float, help="goodput: mean time between tokens limit (s)")
    bench.add_argument("--out", help="write the summary and every request's timings here (JSON)")
    bench.add_argument("--plot-dir", help="write latency_cdf.png here (needs the bench extra)")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(func=_bench)


def add_workloads_command(sub: argparse._SubParsersAction) -> None:
    """Register `prismserve workloads fetch` on the CLI's subparsers."""
    workloads = sub.add_parser(
        "workloads", help="fetch the public traces and media `prismserve bench` and the demo use"
    )
    actions = workloads.add_subparsers(dest="action", metavar="ACTION", required=True)
    fetch = actions.add_parser(
        "fetch",
        help="download the workloads (about 8 MB) and check each file's sha256",
        description="Download every file of the workloads manifest from its upstream repository (or a "
        "mirror), check its sha256 and print the folder. Files already there with the right hash "
        "are kept.",
    )
    fetch.add_argument(
        "--from",
        dest="source",
        metavar="BASE",
        help="a mirror with the same layout: an http(s) base URL or a local folder (default: the upstreams)",
    )
    fetch.add_argument(
        "--dir",
        help="where to put them (default: $PRISMSERVE_WORKLOADS or ~/.cache/prismserve/workloads)",
    )
    fetch.add_argument(
        "--only",
        metavar="GROUPS",
        help="comma-separated groups: servegen, azure, mooncake, media (default: all)",
    )
    fetch.add_argument("--quiet", action="store_true", help="no line per file")
    fetch.set_defaults(func=_workloads_fetch)


def _workloads_fetch(args: argparse.Namespace) -> int:
    from prismserve.bench.fetch import fetch_workloads
    from prismserve.bench.workloads import WorkloadError, fetched_dir

    dest = Path(args.dir or os.environ.get("PRISMSERVE_WORKLOADS") or fetched_dir())
    only = {g.strip() for g in args.only.split(",") if g.strip()} if args.only else None
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        count = fetch_workloads(dest, args.source, only, progress)
    except (WorkloadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{count.fetched} fetched, {count.present} already present", file=sys.stderr)
    print(dest)
    return 0


def build_workload(args: argparse.Namespace):
    """The RequestSpecs the arguments describe."""
    from prismserve.bench import workloads as w

    size = {"count": args.requests, "duration": args.duration, "seed": args.seed}
    if args.workload in TRACES:
        return w.trace(args.workload, w.Arrivals(args.arrivals, args.rate), **size)
    if args.arrivals != "poisson":
        raise w.WorkloadError("the controlled workload has Poisson arrivals only")
    width, _, height = args.resolution.partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise w.WorkloadError(f"--resolution must look like 1920x1080, got {args.resolution!r}")
    return w.controlled(
        args.rate, (int(width), int(height)), args.images, args.input_tokens, args.output_tokens, **size
    )


def _bench(args: argparse.Namespace) -> int:
    from prismserve.bench.loadgen import run_load
    from prismserve.bench.metrics import GoodputLimits, summarize
    from prismserve.bench.workloads import WorkloadError

    try:
        specs = build_workload(args)
    except (WorkloadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not specs:
        print("error: the workload is empty (duration too short for the rate?)", file=sys.stderr)
        return 2
    if args.warmup >= len(specs):
        print(
            f"error: --warmup {args.warmup} leaves none of the {len(specs)} requests to measure",
            file=sys.stderr,
        )
        return 2
    results = asyncio.run(
        run_load(
            args.url,
            args.model,
            specs,
            api_key=args.api_key,
            stream=not args.no_stream,
            progress=not args.quiet,
        )
    )
    summary = summarize(results, args.warmup, GoodputLimits(args.slo_latency, args.slo_ttft, args.slo_tbt))
    print(format_summary(summary))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"summary": summary, "requests": [r.to_json() for r in results]}, indent=1)
        )
    if args.plot_dir:
        from prismserve.bench.plots import latency_cdf

        latency_cdf(
            {args.model: [r.latency_s for r in results if r.ok]}, Path(args.plot_dir) / "latency_cdf.png"
        )
    return 0 if summary["completed"] else 1


def format_summary(summary: dict) -> str:
    """A few lines a person reads: throughput, goodput, latency by type."""

    def ms(stats: dict, key: str) -> str:
        return "-" if stats.get(key) is None else f"{stats[key] * 1e3:.0f}"

    lines = [
        f"requests {summary['requests']}  completed {summary['completed']}  failed {summary['failed']}  "
        f"makespan {summary['makespan_s']:.1f} s",
        f"throughput {summary['throughput_rps']:.2f} req/s (offered {summary['offered_rps']:.2f}, "
        f"steady {summary['steady_rps']:.2f})  "
        f"goodput {summary['goodput_rps']:.2f} req/s  SLO attainment {summary['slo_attainment']:.1%}",
        f"TTFT p50 {ms(summary['ttft_s'], 'p50')} ms p99 {ms(summary['ttft_s'], 'p99')} ms   "
        f"TBT p50 {ms(summary['tbt_s'], 'p50')} ms p99 {ms(summary['tbt_s'], 'p99')} ms",
        f"{'request type':<34} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'p95 ms':>8} {'p99 ms':>8}",
    ]
    rows = [("all", {"requests": summary["requests"], "latency_s": summary["latency_s"]})] + list(
        summary["by_type"].items()
    )
    for name, row in rows:
        lat = row["latency_s"]
        lines.append(
            f"{name:<34} {row['requests']:>5} {ms(lat, 'p50'):>8} {ms(lat, 'p90'):>8} {ms(lat, 'p95'):>8} {ms(lat, 'p99'):>8}"
        )
    for error in summary["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)
