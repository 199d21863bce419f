"""`prismserve profile APP|MODEL`: measure an app's deployments here and write the planner's spec."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path


def add_profile_command(sub: argparse._SubParsersAction) -> None:
    """Register the `profile` subcommand."""
    from prismserve.bench import TRACES

    profile = sub.add_parser(
        "profile",
        help="measure an app's deployments on this hardware and write the planner's spec",
        description="Start the runtime, register APP (or MODEL's default app), find each request type's "
        "deployments by recording the app, serve rounds of each type and write the plan spec "
        "(`prismserve plan SPEC --gpus N`). Profiles are cached per app, model and hardware.",
    )
    profile.add_argument(
        "target", metavar="MODEL|APP.py", help="an app file, a hub id or a checkpoint directory"
    )
    profile.add_argument(
        "--fake-gpus", type=int, help="declare this many GPUs on a local Ray (CPU-only machines)"
    )
    profile.add_argument("--address", help="join this Ray cluster instead of starting a local one")
    profile.add_argument(
        "--workload",
        default="any2any",
        metavar="NAME|FILE",
        help=f"the request mix: {', '.join(TRACES)}, or a workload file of JSON lines (default any2any)",
    )
    profile.add_argument(
        "--requests", type=int, default=200, help="requests drawn from the workload (default 200)"
    )
    profile.add_argument(
        "--batch", type=int, default=4, help="requests of a type served together (default 4)"
    )
    profile.add_argument(
        "--rounds", type=int, default=2, help="measured rounds per type after a warm-up (default 2)"
    )
    profile.add_argument(
        "--refresh", action="store_true", help="measure again even if a cached profile exists"
    )
    profile.add_argument("--offline", action="store_true", help="never contact the hub (HF_HUB_OFFLINE)")
    profile.add_argument("--out", type=Path, help="also write the spec here")
    profile.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    """Profile as asked; errors are one line on stderr and exit code 2."""
    from prismserve.app import AppLoadError
    from prismserve.bench.workloads import WorkloadError
    from prismserve.errors import PrismserveError
    from prismserve.planner import PlannerError
    from prismserve.profile import check_workload
    from prismserve.serve.launch import ServeOptions, StartupError, app_source

    if args.offline:
        from prismserve.offline import go_offline

        go_offline()
    for flag, value in (("--requests", args.requests), ("--batch", args.batch), ("--rounds", args.rounds)):
        if value < 1:
            print(f"error: {flag} must be at least 1, got {value}", file=sys.stderr)
            return 2
    try:
        check_workload(args.workload)  # before anything starts
        source, name, filename = app_source(ServeOptions(target=args.target, offline=args.offline))
        path = asyncio.run(_profile(args, source, name, filename))
    except (StartupError, AppLoadError, WorkloadError, PlannerError, PrismserveError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(path.read_text())
    print(path.read_text(), end="")
    _report_budgets(path, args.out)
    return 0


def _report_budgets(path: Path, out: Path | None) -> None:
    """The budgets measured beside the spec, if the app's SLOs bound any: on stderr, and beside `out`
    (`prismserve serve --budgets FILE` sets them)."""
    from prismserve.profile.budgets import budgets_path

    budgets = budgets_path(path)
    if not budgets.is_file():
        print("prismserve: no batching budgets (the app's SLOs set no TTFT or TBT)", file=sys.stderr)
        return
    if out is not None:
        budgets_path(out).write_text(budgets.read_text())
        budgets = budgets_path(out)
    print(f"prismserve: batching budgets (serve --budgets {budgets}):", file=sys.stderr)
    print(budgets.read_text(), end="", file=sys.stderr)


async def _profile(args: argparse.Namespace, source: str, name: str, filename: str) -> Path:
    from prismserve.profile import cached_profile
    from prismserve.runtime import create_runtime

    runtime = create_runtime(address=args.address, fake_gpus=args.fake_gpus)
    await runtime.start()
    try:
        app = await runtime.register_app(source, name, filename=filename)
        _, path, fresh = await cached_profile(
            runtime, app, source, args.workload, args.requests, args.batch, args.rounds, refresh=args.refresh
        )
        print(f"prismserve: {'measured' if fresh else 'cached'} profile: {path}", file=sys.stderr)
        return path
    finally:
        await runtime.close()
