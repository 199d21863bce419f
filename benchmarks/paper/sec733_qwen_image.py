"""000 §7.3.3: Qwen-Image (text to image) on one 16-GPU cell, prompts of 1,000 and 2,000 tokens.

The paper's planner keeps the monolith for both lengths: the text encoder's work (Table 1: 15.67
req/s on one A100) is tiny next to the generator's (0.20 req/s), so a GPU given to the encoder
idles most of the time and splitting only adds the conditioning's transfer. Here the emulated
Qwen-Image (`prismserve.emulate.catalog.QWEN_IMAGE`: text encoder T, generator G = DiT + VAE, the
monolith TG; every assumption in `emulate/costs.py` `QwenImageCosts`) is served by `prismserve
serve --gpus 16 --profile-workload`, which plans itself at start; that plan is measured, then the
alternatives (Monolith: TG replicas only; T/G: encoders and generators apart), each with the
replica counts the planner picks when limited to them, on the same requests (Poisson arrivals at
`--load` x the plan's predicted throughput; every request one 512x512 image, 20 steps).
Run: python benchmarks/paper/sec733_qwen_image.py [--requests 300] [--speedup 4] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (  # noqa: E402
    Server,
    add_out_argument,
    describe_workload,
    measure,
    plan_for,
    retime,
    started,
    write,
)

from prismserve.bench.plots import throughput_bars  # noqa: E402
from prismserve.bench.workloads import controlled  # noqa: E402
from prismserve.emulate.catalog import QWEN_IMAGE, QWEN_IMAGE_BASELINES  # noqa: E402

NAME = "sec733_qwen_image"
GPUS = 16  # 000 §7.3.3: one 16-GPU cell
PROMPTS = (1000, 2000)  # input tokens (000 §7.3.3 and its footnote 7)
IMAGE = (512, 512)  # the workload's image; the cost model's constants are for it and 20 steps
PAPER_CHOICE = "Monolith"


def layout(plan) -> str:
    """A plan's deployment in one line: `16 x TG` (16 one-replica cells) or `1 x (T 1, G 15)`."""
    return cells_layout([(cell.count, cell.replicas) for cell in plan.cells])


def cells_layout(cells: list[tuple[int, dict[str, int]]]) -> str:
    """`layout` of (count, replicas) pairs (a plan's cells, or those of a result file)."""
    parts = []
    for count, replicas in cells:
        named = {name: n for name, n in replicas.items() if n}
        if len(named) == 1 and set(named.values()) == {1}:
            parts.append(f"{count} x {next(iter(named))}")
        else:
            parts.append(f"{count} x ({', '.join(f'{name} {n}' for name, n in named.items())})")
    return " + ".join(parts)


def _run_layout(run: dict) -> str:
    return cells_layout([(cell.get("count", 1), cell["replicas"]) for cell in run["plan"]["cells"]])


def chosen(plan, baselines: dict) -> str:
    """Which alternative the planner's plan is (same options in the same numbers), else `mixed`."""
    mine = _replicas(plan)
    for label, other in baselines.items():
        if _replicas(other) == mine:
            return label
    return "mixed"


def _replicas(plan) -> dict[str, int]:
    total: dict[str, int] = {}
    for cell in plan.cells:
        for name, n in cell.replicas.items():
            if n:
                total[name] = total.get(name, 0) + n * cell.count
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--speedup", type=float, default=4.0, help="sim time divisor (default 4)")
    parser.add_argument("--load", type=float, default=1.25, help="arrival rate / plan's predicted throughput")
    parser.add_argument(
        "--prompts", type=int, nargs="+", default=list(PROMPTS), help="prompt lengths (tokens)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="30 requests, speedup 50, 1,000-token prompts, plan and T/G only"
    )
    add_out_argument(parser)
    args = parser.parse_args()
    measured = list(QWEN_IMAGE_BASELINES)
    if args.quick:
        args.requests, args.speedup, args.prompts, measured = 30, 50.0, [1000], ["T/G"]

    out: dict = {"model": QWEN_IMAGE.name, "gpus": GPUS, "speedup": args.speedup, "prompts": {}}
    for tokens in args.prompts:
        requests = controlled(1.0, IMAGE, 0.0, tokens, 1, count=args.requests, seed=args.seed)
        spec = QWEN_IMAGE.planner_spec(requests)
        baselines = {
            label: plan_for(QWEN_IMAGE.restricted(spec, opts), GPUS)
            for label, opts in QWEN_IMAGE_BASELINES.items()
        }
        with started(lambda r=requests: Server(QWEN_IMAGE, GPUS, plan_for=r, speedup=args.speedup)) as server:
            planned = server.planned()
            specs = retime(requests, args.load * planned.throughput * args.speedup)
            warmup = args.requests // 10
            print(
                f"{tokens}-token prompts: plan {layout(planned)} ({chosen(planned, baselines)})", flush=True
            )
            runs = {
                "prismserve": measure(
                    server, "prismserve", planned, specs, args.speedup, warmup, deployed=True
                )
            }
            for label in measured:
                runs[label] = measure(server, label, baselines[label], specs, args.speedup, warmup)
        others = {label: run for label, run in runs.items() if label != "prismserve"}
        best = max(others, key=lambda label: others[label].measured_rps)
        out["prompts"][str(tokens)] = {
            "workload": describe_workload(specs),
            "work_s": QWEN_IMAGE.costs.work(requests[0]),
            "plan": layout(planned),
            "plan_is": chosen(planned, baselines),
            "layouts": {label: layout(plan) for label, plan in baselines.items()},
            "runs": {label: run.to_json() for label, run in runs.items()},
            "best_alternative": best,
            "plan_over_best_alternative": runs["prismserve"].measured_rps / others[best].measured_rps,
        }
        throughput_bars(
            {label: run.measured_rps for label, run in runs.items()},
            args.out / f"{NAME}_{tokens}.png",
            predicted={label: run.predicted_rps for label, run in runs.items()},
            title=f"Qwen-Image-like, {GPUS} GPUs, {tokens}-token prompts (req/s, A100 scale)",
        )
    print("wrote", write(NAME, out, args.out))


def _load(results: Path) -> dict | None:
    path = results / f"{NAME}.json"
    return json.loads(path.read_text()) if path.exists() else None


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    """README rows: the deployment the planner chose per prompt length, and its throughput against
    the split deployment (T/G) it turned down."""
    data = _load(results)
    if data is None:
        return [("§7.3.3: Qwen-Image, planner's choice", PAPER_CHOICE, "not run", "-", f"no {NAME}.json")]
    out = []
    for tokens, result in data["prompts"].items():
        runs = result["runs"]
        plan = runs["prismserve"]
        out.append(
            (
                f"§7.3.3: Qwen-Image, 16 GPUs, {int(tokens):,}-token prompts: the planner's choice",
                PAPER_CHOICE.lower(),
                f"{result['plan_is'].lower()} ({_run_layout(plan)}), {plan['measured_rps']:.2f} req/s",
                "-",
                "same choice: a GPU given to the text encoder would idle"
                if result["plan_is"] == PAPER_CHOICE
                else "a different choice (see details)",
            )
        )
        if "T/G" in runs:
            split = runs["T/G"]
            out.append(
                (
                    f"§7.3.3: Qwen-Image, {int(tokens):,}-token prompts: plan / split (T/G) throughput",
                    "> 1 (no number given)",
                    f"{plan['measured_rps'] / split['measured_rps']:.2f}x "
                    f"(predicted {plan['predicted_rps'] / split['predicted_rps']:.2f}x)",
                    "-",
                    f"T/G reached {split['accuracy']:.2f} of its prediction; likely the 28.7 MB "
                    "conditioning it moves per request, which the planner does not count (not isolated)",
                )
            )
    return out


def details(results: Path) -> str:
    """Markdown: per prompt length, each deployment's layout, predicted and measured throughput."""
    data = _load(results)
    if data is None:
        return ""
    lines = [
        f"§7.3.3, Qwen-Image-like on {data['gpus']} GPUs, sim speedup {data['speedup']:g} (req/s at A100 scale):",
        "",
        "| prompt | deployment | layout | predicted | measured | achieved / predicted | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for tokens, result in data["prompts"].items():
        for label, run in result["runs"].items():
            where = _run_layout(run)
            if label == "prismserve":
                where += f" (= {result['plan_is']})"
            lines.append(
                f"| {int(tokens):,} | {label} | {where} | {run['predicted_rps']:.3f} | {run['measured_rps']:.3f} | "
                f"{run['accuracy']:.2f} | {run['summary']['failed']} |"
            )
    work = "; ".join(
        f"{int(t):,} tokens: T {r['work_s']['T'] * 1000:.0f} ms, G {r['work_s']['G']:.2f} s"
        for t, r in data["prompts"].items()
    )
    return "\n".join([*lines, "", f"Work per request (A100-seconds, `QwenImageCosts`): {work}."])


if __name__ == "__main__":
    main()
