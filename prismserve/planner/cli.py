"""`prismserve plan SPEC (--gpus N | --target-rps R) [--json]`."""

from __future__ import annotations

import argparse
import json
import sys


def add_plan_command(sub: argparse._SubParsersAction) -> None:
    """Register the `plan` subcommand."""
    plan = sub.add_parser("plan", help="plan cells, replicas and routing for a model spec (YAML or JSON)")
    plan.add_argument("spec", metavar="SPEC", help="plan spec file (see docs/planner.md)")
    goal = plan.add_mutually_exclusive_group(required=True)
    goal.add_argument("--gpus", type=int, help="maximise throughput on this many GPUs")
    goal.add_argument("--target-rps", type=float, help="use the fewest GPUs that sustain this many requests/s")
    plan.add_argument("--max-cell-exponent", type=int, default=6, help="largest cell is 2^K GPUs (default 6: 64)")
    plan.add_argument("--topology", action="store_true", help="plan on the spec's nodes and bandwidth (small clusters)")
    plan.add_argument("--json", action="store_true", help="print exactly one JSON object")
    plan.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """Run the planner as asked; errors are one line on stderr and exit code 2."""
    from prismserve.planner import PlannerError, build_model, load_spec, plan_for_budget, plan_for_target
    from prismserve.planner.milp import max_throughput_on_topology
    from prismserve.planner.plan import CellPlan, Plan, path_probabilities

    try:
        spec = load_spec(args.spec)
        if args.topology:
            model = build_model(spec)
            solution = max_throughput_on_topology(model)
            plan = Plan(
                gpus=solution.gpus,
                throughput=solution.throughput,
                cells=[
                    CellPlan(gpus=sum(spec.executor(s).gpus * n for s, n in replicas.items()), throughput=0.0, count=1, replicas=replicas)
                    for replicas in solution.placement.values()
                ],
                routing=path_probabilities(model, [(1.0, solution.rates)]),
            )
        elif args.gpus is not None:
            if args.gpus < 1:
                raise PlannerError(f"--gpus must be >= 1, got {args.gpus}")
            plan = plan_for_budget(spec, args.gpus, args.max_cell_exponent)
        else:
            plan = plan_for_target(spec, args.target_rps, args.max_cell_exponent)
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.to_json_dict()))
    else:
        print(_table(plan))
    return 0


def _table(plan) -> str:
    lines = [f"plan: {plan.gpus} GPUs, {plan.throughput:.3f} req/s predicted", "", "cells:"]
    lines.append(f"  {'count':>5} {'GPUs':>5} {'req/s':>10}  replicas")
    for cell in plan.cells:
        replicas = ", ".join(f"{name} x{n}" for name, n in cell.replicas.items())
        lines.append(f"  {cell.count:>5} {cell.gpus:>5} {cell.throughput:>10.3f}  {replicas}")
    lines += ["", "routing (probability of each path per request type):"]
    for request_type, paths in plan.routing.items():
        lines.append(f"  {request_type}: " + ", ".join(f"{path} {p:.3f}" for path, p in paths.items()))
    return "\n".join(lines)
