"""TriInfer (paper 004) on the emulator: Figures 9, 10, 11 and the heuristic against all 35 layouts.

LLaVA-1.5-7B (`prismserve.emulate.LLAVA15`, costs and their sources in `Llava15Costs`) on 8 one-GPU
instances, replayed in virtual time (`prismserve.planner.replay`: Algorithm 1 in every instance,
requests migrating between them). Workloads: one 336x336 image per request (576 tokens) with
dataset-shaped text and output lengths (synthetic: the paper gives only plots of them), arrivals
from the Mooncake conversation trace's timestamps (the paper's production trace, 004 §5.1) scaled
to each rate (requests sharing one of its coarse timestamps spread over the tick). Layouts are
chosen on a held-out trace (another seed and stretch of the trace), as the paper profiles on a
tenth of each dataset and evaluates on the rest. Deterministic for a seed.

- Figure 9: SLO attainment vs per-GPU rate and goodput (≥ 90 % attainment, by bisection) for
  vLLM (8 EPD instances, vLLM's budget: 8192 tokens per step, no dual stream), the same 8 EPD
  instances with Algorithm 1's budgets and dual streams (not in the paper), the fixed layouts
  of the paper's baselines scaled to 8 (DistServe 12EP+20D -> 3EP+5D, EPDServe 4E+8P+20D ->
  1E+2P+5D, and ED+P at 4ED+4P) and the hybrid choice (Algorithm 2).
- Figure 10: hybrid -> E+P+D evenly split (2E+3P+3D) -> the same without stage-level batching.
- Figure 11: the latency breakdown on 1E+3P+4D at 80 % of its goodput (TextCaps).
- §5.4: Algorithm 2's choice against an exhaustive search over the 35 layouts, per dataset and SLO.

Run: python benchmarks/paper/triinfer.py [--seed 0] [--requests 3000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from prismserve.bench.plots import attainment_curves
from prismserve.bench.workloads import (
    Arrivals,
    RequestSpec,
    WorkloadError,
    mooncake,
    poisson_times,
    write_requests,
)
from prismserve.emulate import LLAVA15
from prismserve.planner.replay import (
    Replay,
    TraceRequest,
    all_layouts,
    attainment,
    goodput,
    hybrid_layout,
    layout_name,
    scaled,
)
from prismserve.planner.stage_batching import StageCosts

RESULTS = Path(__file__).resolve().parents[1] / "results"

# text tokens (uniform range: prompt + question + chat template) and output tokens (lognormal
# median, sigma, clipped to [1, 512]) per dataset; LLaVA-1.5's short-answer prompts.
DATASETS = {
    "TextCaps": {"text": (30, 50), "output": (16.0, 0.5)},  # one-sentence captions (~12 words)
    "MME": {"text": (40, 70), "output": (1.5, 0.3)},  # yes/no questions
    "VizWiz": {"text": (40, 80), "output": (4.0, 0.8)},  # a word or phrase, sometimes a sentence
}
SLOS = {"Table 5 (TTFT 4 s, TBT 80 ms)": (4.0, 0.08), "tight TTFT (1 s, 80 ms)": (1.0, 0.08)}
FIXED = {
    "vLLM (8EPD)": {"EPD": 8},
    "8EPD with stage-level batching": {"EPD": 8},
    "DistServe-like EP+D (3EP+5D)": {"EP": 3, "D": 5},
    "EPDServe-like E+P+D (1E+2P+5D)": {"E": 1, "P": 2, "D": 5},
    "ED+P (4ED+4P)": {"ED": 4, "P": 4},
}
EVEN = {"E": 2, "P": 3, "D": 3}
BREAKDOWN_LAYOUT = {"E": 1, "P": 3, "D": 4}  # 004 Figure 11's configuration


def workload(dataset: str, count: int, seed: int, arrivals: str, window: int = 0) -> list[TraceRequest]:
    """`count` requests of `dataset` (one image each) at a mean rate of 1 request/s. Mooncake arrivals
    come from window `window` of the trace (requests `window·count` on), so that the evaluation and
    the history traces (and seeds) see different stretches of it."""
    rng = np.random.default_rng(seed)
    shape = DATASETS[dataset]
    if arrivals == "mooncake":
        times = mooncake_times(count, window)
    else:
        times = list(poisson_times(rng, 1.0, count, None))
    low, high = shape["text"]
    median, sigma = shape["output"]
    text = rng.integers(low, high + 1, count)
    output = np.clip(np.rint(rng.lognormal(np.log(median), sigma, count)), 1, 512).astype(int)
    return [TraceRequest(float(t), int(x), int(o), 1) for t, x, o in zip(times, text, output, strict=True)]


def mooncake_times(count: int, window: int) -> list[float]:
    """Arrival times of `count` Mooncake conversation requests from window `window`, at 1 request/s.

    The trace's timestamps are coarse: 90 % of its inter-arrival gaps are 0, so requests come in
    clumps that no rate scaling separates. Requests sharing a timestamp are spread evenly over the
    interval to the next distinct one (what the trace's resolution cannot tell apart)."""
    raw = [s.arrival_s for s in mooncake("conversation", Arrivals("trace"), count=(window + 1) * count + 1)]
    if len(raw) < (window + 1) * count + 1:
        raise WorkloadError(
            f"the Mooncake trace holds {len(raw)} requests: too few for window {window} of {count}"
        )
    times = np.array(raw[window * count : (window + 1) * count + 1])
    spread = times.copy()
    start = 0
    for i in range(1, len(times) + 1):
        if i == len(times) or times[i] != times[start]:
            end = times[i] if i < len(times) else times[start] + 1.0
            spread[start:i] = times[start] + (end - times[start]) * np.arange(i - start) / (i - start)
            start = i
    spread = spread[:count] - spread[0]
    return list(spread * (count - 1) / spread[-1])


def with_slo(costs: StageCosts, ttft: float, tbt: float) -> StageCosts:
    return costs.model_copy(update={"ttft_s": ttft, "tbt_s": tbt})


def curve(trace, layout, costs, rates, **options) -> list[dict]:
    """SLO attainment at each per-GPU rate (Figure 9's curves)."""
    out = []
    for rate in rates:
        a = attainment(trace, layout, costs, rate, **options)
        out.append({"rate_per_gpu": rate, "slo": a.slo, "ttft": a.ttft, "tbt": a.tbt})
    return out


def figure9(trace, history, costs, rates, instances) -> dict:
    """Goodput and attainment curves: vLLM, the fixed layouts, the hybrid choice."""
    choice = hybrid_layout(history, costs, instances)
    rows = {}
    for label, layout in FIXED.items():
        vllm = label.startswith("vLLM")
        options = {"stage_batching": False, "dual_stream": False} if vllm else {}
        rows[label] = {
            "layout": layout_name(layout),
            "goodput_per_gpu": goodput(trace, layout, costs, **options),
            "curve": curve(trace, layout, costs, rates, **options),
        }
    rows["hybrid (Algorithm 2)"] = {
        "layout": layout_name(choice.layout),
        "goodput_per_gpu": goodput(trace, choice.layout, costs),
        "curve": curve(trace, choice.layout, costs, rates),
        "candidates_on_history": choice.candidates,
    }
    return rows


def figure10(trace, history, costs, instances) -> dict:
    """Ablation: hybrid -> evenly split E+P+D -> the same without stage-level batching."""
    choice = hybrid_layout(history, costs, instances)
    return {
        "hybrid": {
            "layout": layout_name(choice.layout),
            "goodput_per_gpu": goodput(trace, choice.layout, costs),
        },
        "w/o hybrid (even E+P+D)": {
            "layout": layout_name(EVEN),
            "goodput_per_gpu": goodput(trace, EVEN, costs),
        },
        "w/o hybrid and stage-level batching": {
            "layout": layout_name(EVEN),
            "goodput_per_gpu": goodput(trace, EVEN, costs, stage_batching=False),
        },
    }


STAGES = (
    ("encode queue", "entered", "encode_start"),
    ("encode exec", "encode_start", "encode_end"),
    ("EP migration", "encode_end", "prefill_ready"),
    ("prefill queue", "prefill_ready", "prefill_start"),
    ("prefill exec", "prefill_start", "first_token"),
    ("PD migration", "first_token", "decode_ready"),
    ("decode queue", "decode_ready", "decode_start"),
    ("decode exec", "decode_start", "done"),
)


def figure11(trace, costs) -> dict:
    """Mean seconds per stage on 1E+3P+4D at 80 % of its goodput, and the migrations' P95."""
    rate = 0.8 * goodput(trace, BREAKDOWN_LAYOUT, costs)
    jobs = Replay(BREAKDOWN_LAYOUT, costs).run(scaled(trace, rate * sum(BREAKDOWN_LAYOUT.values())))
    done = [j for j in jobs if "done" in j.times and "decode_start" in j.times]
    mean = {name: statistics.fmean(j.times[b] - j.times[a] for j in done) for name, a, b in STAGES}
    p95 = {
        name: float(np.percentile([j.times[b] - j.times[a] for j in done], 95))
        for name, a, b in STAGES
        if "migration" in name
    }
    total = sum(mean.values())
    return {
        "layout": layout_name(BREAKDOWN_LAYOUT),
        "rate_per_gpu": rate,
        "requests": len(done),
        "mean_s": mean,
        "share": {k: v / total for k, v in mean.items()},
        "migration_p95_s": p95,
    }


def exhaustive(trace, history, costs, instances) -> dict:
    """Algorithm 2's choice (made on the history) against all layouts (goodput on the evaluation trace)."""
    rates = {layout_name(x): goodput(trace, x, costs) for x in all_layouts(instances)}
    choice = hybrid_layout(history, costs, instances)
    chosen = layout_name(choice.layout)
    ranked = sorted(rates.values(), reverse=True)
    best = ranked[0]
    return {
        "layouts": len(rates),
        "best": max(rates, key=lambda k: rates[k]),
        "best_goodput": best,
        "chosen": chosen,
        "chosen_goodput": rates[chosen],
        "rank": 1 + sum(r > rates[chosen] for r in ranked),
        "picked_best": rates[chosen] >= best,
        "ratio_to_best": rates[chosen] / best if best else 0.0,
        "goodput": rates,
    }


def write_inputs(folder: Path, trace: list[TraceRequest]) -> None:
    """The plan spec of LLaVA-1.5 at `trace`'s mix (its stage costs included) and the trace as a workload file."""
    folder.mkdir(parents=True, exist_ok=True)
    specs = [RequestSpec(r.arrival_s, r.text_tokens, r.output_tokens, images=((336, 336),)) for r in trace]
    spec = LLAVA15.planner_spec(specs)
    (folder / "llava15_spec.json").write_text(spec.model_dump_json(exclude_none=True, indent=1))
    write_requests(specs, folder / "textcaps_trace.jsonl")
    print(f"wrote {folder / 'llava15_spec.json'} and {folder / 'textcaps_trace.jsonl'}")


def plot_figure9(figure9: dict, folder: Path, prefix: str) -> list[Path]:
    """One PNG of attainment curves per dataset: <folder>/<prefix>_fig9_<dataset>.png."""
    paths = []
    for dataset, rows in figure9.items():
        curves = {label: [(p["rate_per_gpu"], p["slo"]) for p in row["curve"]] for label, row in rows.items()}
        goodputs = {label: row["goodput_per_gpu"] for label, row in rows.items()}
        path = folder / f"{prefix}_fig9_{dataset.lower()}.png"
        paths.append(
            attainment_curves(curves, goodputs, path, f"LLaVA-1.5-7B, {dataset}-shaped, 8 instances")
        )
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the evaluation trace (history: seed + 1000)"
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--arrivals", choices=["mooncake", "poisson"], default="mooncake")
    parser.add_argument(
        "--quick", action="store_true", help="4 instances, TextCaps only, one SLO (smoke test)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--write-inputs",
        type=Path,
        metavar="DIR",
        help="only write DIR/llava15_spec.json and DIR/textcaps_trace.jsonl (the inputs of "
        "`prismserve plan SPEC --gpus 8 --by-replay TRACE`) and exit",
    )
    args = parser.parse_args()
    if args.write_inputs is not None:
        write_inputs(
            args.write_inputs, workload("TextCaps", args.requests, args.seed, args.arrivals, 2 * args.seed)
        )
        return
    instances = 4 if args.quick else 8
    datasets = ["TextCaps"] if args.quick else list(DATASETS)
    slos = dict(list(SLOS.items())[:1]) if args.quick else SLOS
    if args.quick:
        FIXED.update({k: {kind: max(1, n // 2) for kind, n in v.items()} for k, v in FIXED.items()})
        FIXED["EPDServe-like E+P+D (1E+2P+5D)"] = {"E": 1, "P": 1, "D": 2}
        EVEN.update({"E": 1, "P": 2, "D": 1})
        BREAKDOWN_LAYOUT.update({"E": 1, "P": 2, "D": 1})
    base = LLAVA15.costs.stage_costs()
    assert base is not None
    started = time.process_time()
    try:
        traces = {d: workload(d, args.requests, args.seed, args.arrivals, 2 * args.seed) for d in datasets}
        histories = {
            d: workload(d, args.requests, args.seed + 1000, args.arrivals, 2 * args.seed + 1)
            for d in datasets
        }
    except WorkloadError as exc:
        sys.exit(f"error: {exc} (or run with --arrivals poisson)")
    rates = [0.5 * k for k in range(1, 29)]
    out: dict = {
        "model": LLAVA15.name,
        "instances": instances,
        "requests": args.requests,
        "seed": args.seed,
        "arrivals": args.arrivals,
        "costs": base.model_dump(),
        "figure9": {},
        "figure10": {},
        "exhaustive": {},
    }
    table5 = with_slo(base, *SLOS["Table 5 (TTFT 4 s, TBT 80 ms)"])
    for d in datasets:
        out["figure9"][d] = figure9(traces[d], histories[d], table5, rates, instances)
        print(f"Figure 9, {d} (goodput, requests/s per GPU):", flush=True)
        for label, row in out["figure9"][d].items():
            print(f"  {label:<34} {row['layout']:<10} {row['goodput_per_gpu']:7.3f}", flush=True)
    out["figure10"] = figure10(traces["TextCaps"], histories["TextCaps"], table5, instances)
    print("Figure 10, TextCaps:", flush=True)
    for label, row in out["figure10"].items():
        print(f"  {label:<38} {row['layout']:<10} {row['goodput_per_gpu']:7.3f}", flush=True)
    out["figure11"] = figure11(traces["TextCaps"], table5)
    print(f"Figure 11, TextCaps on {out['figure11']['layout']} at {out['figure11']['rate_per_gpu']:.2f}/GPU:")
    for name, seconds in out["figure11"]["mean_s"].items():
        print(f"  {name:<14} {seconds * 1000:9.2f} ms  {out['figure11']['share'][name]:6.1%}")
    for d in datasets:
        for slo_name, slo in slos.items():
            result = exhaustive(traces[d], histories[d], with_slo(base, *slo), instances)
            out["exhaustive"][f"{d}, {slo_name}"] = result
            print(
                f"heuristic vs {result['layouts']} layouts, {d}, {slo_name}: chose {result['chosen']} "
                f"(rank {result['rank']}, {result['ratio_to_best']:.3f} of the best, {result['best']})",
                flush=True,
            )
    cases = list(out["exhaustive"].values())
    out["exhaustive_summary"] = {
        "cases": len(cases),
        "picked_best": sum(c["picked_best"] for c in cases),
        "mean_rank": statistics.fmean(c["rank"] for c in cases),
        "mean_ratio_to_best": statistics.fmean(c["ratio_to_best"] for c in cases),
    }
    out["cpu_seconds"] = time.process_time() - started
    print(json.dumps(out["exhaustive_summary"]), f"CPU {out['cpu_seconds']:.0f} s")
    args.results.mkdir(parents=True, exist_ok=True)
    poisson = "_poisson" if args.arrivals == "poisson" else ""
    name = f"triinfer{'_quick' if args.quick else ''}{poisson}_seed{args.seed}.json"
    (args.results / name).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.results / name}")
    for path in plot_figure9(out["figure9"], args.results, name.removesuffix(".json")):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()


PAPER_FIG9 = "1.3x–3.7x"  # 004 §5.2: the hybrid layout's goodput over vLLM across datasets


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    """Figure 9 (hybrid / vLLM goodput per dataset) and Figure 10's ablation, from `triinfer_seed0.json`."""
    path = results / "triinfer_seed0.json"
    if not path.exists():
        return [("TriInfer Fig 9: hybrid / vLLM goodput", PAPER_FIG9, "not run", "-", f"no {path.name}")]
    data = json.loads(path.read_text())
    ratios = {
        name: systems["hybrid (Algorithm 2)"]["goodput_per_gpu"] / systems["vLLM (8EPD)"]["goodput_per_gpu"]
        for name, systems in data["figure9"].items()
    }
    ablation = data["figure10"]
    even = ablation["w/o hybrid (even E+P+D)"]["goodput_per_gpu"]
    return [
        (
            "TriInfer Fig 9: LLaVA-1.5-7B, hybrid / vLLM goodput, " + " · ".join(ratios),
            PAPER_FIG9,
            " · ".join(f"{r:.2f}x" for r in ratios.values()),
            f"{max(ratios.values()) / 3.7:.2f} (best case)",
            "trace replay of a roofline fitted to the paper's text (its figures have no tables)",
        ),
        (
            "TriInfer Fig 10: hybrid / even E+P+D goodput",
            "plot only",
            f"{ablation['hybrid']['goodput_per_gpu'] / even:.2f}x",
            "-",
            "",
        ),
    ]
