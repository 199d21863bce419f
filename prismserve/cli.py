"""The `prismserve` command: a thin layer over the packages."""

from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prismserve",
        description="Serve any-to-any multimodal models: plan, split and serve their components.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="serve the toy Omni app in-process: record & replay against fake executors"
    )
    demo.add_argument("--json", action="store_true", help="print each recorded graph as JSON")
    demo.set_defaults(func=_demo)

    check = sub.add_parser("check", help="validate an app file and list the unit-task deployments it needs")
    check.add_argument("app", metavar="APP.py", help="the app file")
    check.set_defaults(func=_check)

    from prismserve.planner.cli import add_plan_command

    add_plan_command(sub)
    return parser


def _version() -> str:
    from prismserve import __version__

    return f"prismserve {__version__}"


def _demo(args: argparse.Namespace) -> int:
    from prismserve.toy.demo import run_demo

    return run_demo(as_json=args.json)


def _check(args: argparse.Namespace) -> int:
    from prismserve.app import AppLoadError, load_app

    try:
        app = load_app(args.app)
    except AppLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kind = f"streams {app.response_type.__name__}" if app.streaming else f"returns {app.response_type.__name__}"
    print(f"app {app.name!r}: serve({app.request_type.__name__}) {kind}; tasks: {', '.join(app.tasks)}")
    units = app.unit_tasks()
    print(f"{len(units)} unit-task deployments (equivalent unit tasks shared):")
    for key, task in units.items():
        print(f"  {key}  executor={task.executor_kind}  gpus/replica={task.gpus_per_replica}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `prismserve` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
