"""`prismserve plan SPEC (--gpus N | --target-rps R) [--json] [--topology] [--current PLAN.json] [--by-replay TRACE]`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prismserve.planner import Plan, PlanSpec

WARN_GPUS = 10_000  # plans larger than this get a warning: more often a typo than a deployment


def add_plan_command(sub: argparse._SubParsersAction) -> None:
    """Register the `plan` subcommand on the `prismserve` subparsers."""
    plan = sub.add_parser(
        "plan",
        help="plan cells, replicas and routing for a model spec (YAML or JSON)",
        description="Plan power-of-two cells of deployment-option replicas and request-static routing for a plan spec "
        "(docs/planner.md): the most throughput for N GPUs, or the fewest GPUs for a target rate.",
    )
    plan.add_argument("spec", metavar="SPEC", help="plan spec file, .yaml or .json (see docs/planner.md)")
    goal = plan.add_mutually_exclusive_group(required=True)
    goal.add_argument("--gpus", type=int, metavar="N", help="maximise throughput on N GPUs")
    goal.add_argument(
        "--target-rps", type=float, metavar="R", help="use the fewest GPUs that sustain R requests/s"
    )
    plan.add_argument(
        "--max-cell-exponent",
        type=int,
        default=None,
        metavar="K",
        help="the largest cell is 2^K GPUs (default: the spec's max_cell_gpus, else 6: 64 GPUs)",
    )
    plan.add_argument(
        "--topology",
        action="store_true",
        help="plan on the spec's nodes and links instead of cells (topology-aware MILP; small clusters)",
    )
    plan.add_argument(
        "--current",
        metavar="PLAN.json",
        help="with --target-rps: the running plan (a `--json` output); report the cells to keep, add and remove",
    )
    plan.add_argument(
        "--by-replay",
        metavar="TRACE",
        help="with --gpus: also lay out the GPUs by replaying TRACE (JSON lines, as `serve --record-trace` "
        "writes) with the spec's `stages` (TriInfer Algorithm 2), and give both plans' replayed goodput",
    )
    plan.add_argument("--json", action="store_true", help="print exactly one JSON object")
    plan.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """Run the planner as asked; errors are one line on stderr and exit code 2."""
    from prismserve.planner import (
        PlannerError,
        load_plan,
        load_spec,
        plan_changes,
        plan_for_budget,
        plan_for_target,
        plan_on_topology,
    )

    try:
        if args.gpus is not None and args.gpus < 1:
            raise PlannerError(f"--gpus must be at least 1, got {args.gpus}")
        if args.target_rps is not None and not (args.target_rps > 0 and math.isfinite(args.target_rps)):
            raise PlannerError(f"--target-rps must be a finite number > 0, got {args.target_rps}")
        if args.current and args.target_rps is None:
            raise PlannerError("--current re-plans for a new target: give --target-rps too")
        if args.by_replay and args.gpus is None:
            raise PlannerError("--by-replay lays out a number of GPUs: give --gpus, not --target-rps")
        if args.current and args.topology:
            raise PlannerError("--current compares cell mixtures; it does not apply to --topology plans")
        current = load_plan(args.current) if args.current else None
        spec = load_spec(args.spec)
        if args.topology:
            plan = plan_on_topology(spec, gpus=args.gpus, rps=args.target_rps)
        elif args.gpus is not None:
            plan = plan_for_budget(spec, args.gpus, args.max_cell_exponent)
        else:
            plan = plan_for_target(spec, args.target_rps, args.max_cell_exponent)
        change = plan_changes(current, plan) if current is not None else None
        replayed = _by_replay(args, spec, plan) if args.by_replay else None
    except PlannerError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if plan.gpus is not None and plan.gpus > WARN_GPUS:
        print(
            f"warning: this plan needs {plan.gpus:,} GPUs (over {WARN_GPUS:,}); check the target and the "
            "spec's throughputs",
            file=sys.stderr,
        )
    if args.json:
        data = plan.to_json_dict()
        if change is not None:
            data["changes"] = {
                key: [cell.model_dump(exclude_none=True) for cell in cells]
                for key, cells in (("keep", change.keep), ("add", change.add), ("remove", change.remove))
            }
        if replayed is not None:
            data["replay"] = replayed
        print(json.dumps(data))
    else:
        print(_table(plan, change))
        if replayed is not None:
            print(_replay_table(replayed))
    return 0


def _by_replay(args: argparse.Namespace, spec: PlanSpec, plan: Plan) -> dict:
    """The MILP plan's layout and Algorithm 2's, each with its goodput replayed on the trace."""
    from prismserve.planner import PlannerError
    from prismserve.planner.replay import goodput, hybrid_layout, layout_name, read_trace

    if spec.stages is None:
        raise PlannerError(
            "--by-replay needs the spec's `stages` (per-instance latencies and SLOs, docs/planner.md)"
        )
    trace = read_trace(args.by_replay)
    milp = plan_layout(spec, plan)
    choice = hybrid_layout(trace, spec.stages, args.gpus)
    return {
        "trace": args.by_replay,
        "requests": len(trace),
        "ttft_s": spec.stages.ttft_s,
        "tbt_s": spec.stages.tbt_s,
        "milp": {
            "layout": milp,
            "name": layout_name(milp),
            "goodput_per_gpu": goodput(trace, milp, spec.stages),
        },
        "hybrid": {
            "layout": choice.layout,
            "name": layout_name(choice.layout),
            "goodput_per_gpu": choice.goodput,
            "candidates": choice.candidates,
        },
    }


def plan_layout(spec: PlanSpec, plan: Plan) -> dict[str, int]:
    """The MILP plan as a replay layout: one-GPU instances per kind (an option's components, E/P/D)."""
    from prismserve.planner import PlannerError
    from prismserve.planner.stage_batching import KINDS

    options = {option.name: option for option in spec.options}
    layout: dict[str, int] = {}
    for cell in plan.cells:
        for name, replicas in cell.replicas.items():
            option = options[name]
            kind = "".join(c for c in ("E", "P", "D") if c in option.components)
            if kind not in KINDS or len(kind) != len(option.components) or option.gpus != 1:
                raise PlannerError(
                    f"option {name!r} ({'+'.join(option.components)} on {option.gpus} GPUs) is no one-GPU "
                    "E/P/D instance; --by-replay replays specs whose components are E, P and D"
                )
            layout[kind] = layout.get(kind, 0) + replicas * cell.count
    return layout


def _replay_table(replayed: dict) -> str:
    lines = [
        "",
        f"by trace replay ({replayed['requests']} requests of {replayed['trace']}; goodput: requests/s per GPU "
        f"with 90 % of requests within TTFT {replayed['ttft_s']:g} s and TBT {replayed['tbt_s']:g} s):",
    ]
    for label, key in (("MILP plan", "milp"), ("replay (Algorithm 2)", "hybrid")):
        entry = replayed[key]
        lines.append(f"  {label:<22} {entry['name']:<14} goodput {entry['goodput_per_gpu']:.3f}")
    candidates = ", ".join(f"{name} {rate:.3f}" for name, rate in replayed["hybrid"]["candidates"].items())
    lines.append(f"  Algorithm 2's candidates: {candidates}")
    return "\n".join(lines)


def _cells(cells) -> list[str]:
    lines = [f"  {'count':>5} {'GPUs':>5} {'req/s':>10}  replicas per option"]
    for cell in cells:
        where = f"{cell.node}: " if cell.node else ""
        replicas = ", ".join(f"{name} x{n}" for name, n in cell.replicas.items())
        lines.append(f"  {cell.count:>5} {cell.gpus:>5} {cell.throughput:>10.3f}  {where}{replicas}")
    return lines


def _table(plan, change=None) -> str:
    largest = f" (cells of up to {plan.max_cell_gpus} GPUs)" if plan.max_cell_gpus else ""
    lines = [f"plan: {plan.gpus} GPUs, {plan.throughput:.3f} req/s predicted{largest}", ""]
    lines += ["nodes:" if any(c.node for c in plan.cells) else "cells:", *_cells(plan.cells)]
    lines += ["", "routing (probability of each path per request type):"]
    for request_type, paths in plan.routing.items():
        ranked = sorted(paths.items(), key=lambda item: -item[1])
        lines.append(f"  {request_type}: " + ", ".join(f"{path} {p:.3f}" for path, p in ranked))
    if change is not None:
        for title, cells in (
            ("keep (identical cells stay up)", change.keep),
            ("add", change.add),
            ("remove", change.remove),
        ):
            lines += ["", f"{title}:", *(_cells(cells) if cells else ["  none"])]
    return "\n".join(lines)
