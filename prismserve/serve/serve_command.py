"""`prismserve serve`: its flags, and `--config FILE` holding any of them (the command line wins)."""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from prismserve.serve.launch import ServeOptions

DEFAULTS: dict[str, Any] = {
    "name": None,
    "plan": None,
    "budgets": None,
    "gpus": None,
    "profile_workload": "any2any",
    "replan": True,
    "fake_gpus": None,
    "address": None,
    "routing": "static",
    "host": "127.0.0.1",
    "port": 8000,
    "in_process": False,
    "offline": False,
    "engine": None,
    "dtype": None,
    "max_model_len": None,
    "quantization": None,
    "gpu_memory_utilization": None,
    "tensor_parallel_size": None,
    "prefill_decode": None,
    "log_level": "warning",
    "log_format": "text",
    "access_log": True,
    "api_key": None,
    "allowed_media_domains": None,
    "record_trace": None,
    "state": None,
    "write_app": None,
    "component_gib": {},
}
"""Every setting of `prismserve serve` (by its flag's dest) and its value when neither the command
line nor the config file gives one."""

ENGINE_SETTINGS = (
    "engine",
    "dtype",
    "max_model_len",
    "quantization",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "prefill_decode",
)


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the problem."""


def add_serve_command(sub: Any) -> None:
    """Add `prismserve serve` to the command's subparsers."""
    serve = sub.add_parser(
        "serve",
        help="serve a model (hub id or checkpoint directory) or an app file: start the runtime and the gateway",
        description="Serve MODEL (a hub id such as Qwen/Qwen2.5-Omni-7B, or a local checkpoint directory) "
        "with its family's default app, or an app file (APP.py). Every flag can also be set in --config "
        "FILE (YAML: flag names as keys, `model:` for MODEL); the command line wins.",
        argument_default=argparse.SUPPRESS,
    )
    add_serve_options(serve)
    serve.add_argument("--config", metavar="FILE", help="YAML file of settings (keys: the flags' names)")
    serve.set_defaults(func=run_serve)


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    """The settings of `prismserve serve`, on the command line and in a config file alike."""
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL|APP.py",
        help="a hub id or checkpoint directory (its family's default app), or an app file (*.py)",
    )
    parser.add_argument(
        "--served-model-name",
        "--name",
        dest="name",
        help="the name clients use as `model` (default: the hub id, the directory's name, or the file's stem)",
    )
    parser.add_argument(
        "--write-app",
        metavar="FILE",
        help="write the app that would be served (MODEL's default app, for the checkpoint and engine flags "
        "given) to FILE ('-': standard output) and exit, starting nothing; edit it, then `prismserve serve FILE`",
    )
    parser.add_argument("--plan", metavar="PLAN.json", help="deployment plan to apply at start")
    parser.add_argument(
        "--budgets",
        metavar="FILE",
        help="batching budgets `prismserve profile` measured (its .budgets.yaml): each deployment's "
        "images per encoder batch and tokens per vLLM step, set before it starts",
    )
    parser.add_argument(
        "--gpus",
        type=_gpus,
        metavar="N|all",
        help="plan for N GPUs (all: every GPU of the cluster) at start: profile the app on this hardware "
        "(cached, see `prismserve profile`), plan, deploy; without it each deployment gets one replica",
    )
    parser.add_argument(
        "--profile-workload",
        metavar="NAME|FILE",
        help="with --gpus: the workload whose request mix the profile and plan are for: a name of `prismserve bench --workload` or a workload file of JSON lines (default: any2any)",
    )
    parser.add_argument(
        "--replan",
        action=argparse.BooleanOptionalAction,
        help="with --gpus: re-plan when the traffic's request mix drifts from the one planned for "
        "(default), or keep the plan made at start (--no-replan)",
    )
    parser.add_argument(
        "--fake-gpus", type=int, help="declare this many GPUs on a local Ray (CPU-only machines)"
    )
    parser.add_argument("--address", help="join this Ray cluster instead of starting a local one")
    parser.add_argument(
        "--routing",
        choices=["static", "dynamic", "tokens", "path"],
        help="replica choice of deployments whose app sets none: static (fewest calls, no queries; default), "
        "dynamic (least loaded, replicas asked their queues) or tokens (fewest pending tokens); "
        "path: each request's whole path among the plan's picked by the counted load at its entry, "
        "then followed as static",
    )
    parser.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: 8000; 0 picks a free one)")
    parser.add_argument(
        "--in-process",
        action=argparse.BooleanOptionalAction,
        help="no Ray, no declared GPUs: run unit tasks in this process on their real executors (development)",
    )
    parser.add_argument(
        "--offline",
        action=argparse.BooleanOptionalAction,
        help="never reach the model hub (HF_HUB_OFFLINE=1, here and on every replica): local checkpoints "
        "and the hub cache only",
    )
    engine = parser.add_argument_group("engine (prismserve serve MODEL)")
    engine.add_argument(
        "--engine",
        choices=["transformers", "vllm"],
        help="what runs the LLM stage (default: the family's first; vLLM needs `prismserve vllm-env`)",
    )
    engine.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="every component's weights' dtype, on either engine (default auto: the checkpoint's own)",
    )
    engine.add_argument("--max-model-len", type=int, help="vLLM: the context length")
    engine.add_argument(
        "--quantization",
        help="vLLM: the weights' quantization method (compressed-tensors, awq, gptq, fp8 …; "
        "default: the checkpoint's quantization_config, else none)",
    )
    engine.add_argument(
        "--gpu-memory-utilization",
        type=_share,
        help="the share of one GPU each replica of the LLM stage (image families: the generator) takes, "
        "0 < x <= 1 (its deployment's gpus; vLLM's gpu_memory_utilization)",
    )
    engine.add_argument(
        "--tensor-parallel-size",
        type=int,
        help="vLLM: GPUs per replica of the LLM stage (tensor parallelism)",
    )
    engine.add_argument(
        "--prefill-decode",
        action=argparse.BooleanOptionalAction,
        help="vLLM: the LLM stage as two deployments, prefill and decode, the KV cache handed over by "
        "vLLM's KV connector (vision-language and Omni families)",
    )
    engine.add_argument(
        "--component-gib",
        type=_component_gib,
        help="GiB a component needs when the components share fewer GPUs than they are (`thinker=30,"
        "talker=6`; in a config file a mapping): replaces the need computed from its weights and budget",
    )
    gateway = parser.add_argument_group("gateway")
    gateway.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's and prismserve's log level (default: warning)",
    )
    gateway.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="prismserve's log lines: text, or one JSON object per line; both carry the id of the "
        "request being served (default: text)",
    )
    gateway.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        help="uvicorn's access log, one line per request at info level (default: on)",
    )
    gateway.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` on every /v1 route (default: $PRISMSERVE_API_KEY; none: open)",
    )
    gateway.add_argument(
        "--allowed-media-domains",
        type=_domains,
        metavar="HOST[,HOST...]",
        help="fetch media URLs only from these hosts (default: any public host; '' fetches none)",
    )
    gateway.add_argument(
        "--record-trace",
        metavar="FILE",
        help="append one JSON line per answered chat request to FILE (arrival, words, image sizes, output "
        "tokens): the trace `prismserve plan --by-replay` lays instances out with",
    )
    gateway.add_argument(
        "--state",
        metavar="FILE",
        help="keep the apps registered and the plans posted through the admin API in FILE, and restore "
        "them at start: they survive a restart of the server",
    )


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting: the defaults, under the config file's, under the command line's."""
    given = {key: value for key, value in vars(args).items() if key not in ("func", "config", "command")}
    from_file = read_config(Path(args.config)) if getattr(args, "config", None) else {}
    merged = {**DEFAULTS, "model": None, **from_file, **given}
    if merged["api_key"] is None and os.environ.get("PRISMSERVE_API_KEY") is not None:
        merged["api_key"] = os.environ["PRISMSERVE_API_KEY"]
    return merged


def read_config(path: Path) -> dict[str, Any]:
    """The settings in a YAML config file, checked by the same parser as the flags."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config file must be a mapping of settings, not {type(data).__name__}")
    parser = _FileParser(path)
    add_serve_options(parser)
    known = {option for action in parser._actions for option in action.option_strings}
    argv: list[str] = []
    model: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if key == "model":
            model = [str(value)]
        elif flag not in known:
            options = sorted(o[2:] for o in known if o.startswith("--") and not o.startswith("--no-"))
            raise ConfigError(f"{path}: unknown setting {key!r}; settings: model, {', '.join(options)}")
        elif isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            argv.append(f"{flag}={','.join(f'{k}={v}' for k, v in value.items())}")
        elif isinstance(value, list):
            argv.append(f"{flag}={','.join(str(v) for v in value)}")
        elif value is not None:
            argv.append(f"{flag}={value}")
    return vars(parser.parse_args([*argv, *model]))


class _FileParser(argparse.ArgumentParser):
    """Reports a bad value in a config file as a `ConfigError` naming the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(prog=str(path), argument_default=argparse.SUPPRESS, add_help=False)
        self.path = path

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.path}: {message.replace('argument --', 'setting ')}")


def _share(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a share of one GPU is 0 < x <= 1, not {text}")
    return value


def _gpus(text: str) -> int | str:
    if text == "all":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of GPUs or 'all', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"plan for at least 1 GPU, got {value}")
    return value


def _component_gib(text: str) -> dict[str, float]:
    stated = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, gib = part.partition("=")
        try:
            stated[name.strip()] = float(gib)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected COMPONENT=GIB pairs (thinker=30), got {part!r}"
            ) from None
        if not stated[name.strip()] > 0 or not name.strip():
            raise argparse.ArgumentTypeError(f"expected COMPONENT=GIB with GIB > 0, got {part!r}")
    return stated


def _domains(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def run_serve(args: argparse.Namespace) -> int:
    """`prismserve serve`: merge the settings, then serve until stopped."""
    try:
        options = settings(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if options["model"] is None:
        print("error: give a MODEL (hub id or checkpoint directory) or an APP.py to serve", file=sys.stderr)
        return 2
    if options["offline"]:
        from prismserve.offline import go_offline

        go_offline()  # before the Hugging Face libraries are imported; replicas inherit it
    from pydantic import ValidationError

    from prismserve.gateway.errors import validation_message
    from prismserve.models.family import EngineSettings
    from prismserve.runtime.cluster import exit_past_a_lost_ray
    from prismserve.serve.launch import ServeOptions, run_server

    try:
        engine = EngineSettings(**{key: options[key] for key in ENGINE_SETTINGS})
    except ValidationError as exc:
        print(f"error: {validation_message(exc)}", file=sys.stderr)
        return 2
    # --write-app: the app that would be served, written for the user to edit; nothing starts.
    run = run_server if options["write_app"] is None else partial(write_app, path=options["write_app"])
    code = run(
        ServeOptions(
            target=options["model"],
            name=options["name"],
            plan_path=options["plan"],
            budgets_path=options["budgets"],
            gpus=options["gpus"],
            profile_workload=options["profile_workload"],
            replan=options["replan"],
            fake_gpus=options["fake_gpus"],
            address=options["address"],
            routing=options["routing"],
            host=options["host"],
            port=options["port"],
            in_process=options["in_process"],
            offline=options["offline"],
            engine=engine,
            log_level=options["log_level"],
            log_format=options["log_format"],
            access_log=options["access_log"],
            api_key=options["api_key"],
            allowed_media_domains=options["allowed_media_domains"],
            record_trace=options["record_trace"],
            component_gib=options["component_gib"],
            state=options["state"],
        )
    )
    exit_past_a_lost_ray(code)  # stopped with its local Ray: no 60 s wait for Ray's dead GCS
    return code


def write_app(options: ServeOptions, path: str) -> int:
    """`--write-app FILE`: the app `options` would serve, checked as serving checks it and written to
    FILE ('-': standard output), for the user to edit; nothing starts. Returns the exit code."""
    from prismserve.app import AppLoadError, load_app_source
    from prismserve.serve.launch import StartupError, app_source

    try:
        source, name, filename = app_source(options)
        load_app_source(source, name, filename=filename)
    except (StartupError, AppLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if path == "-":
        sys.stdout.write(source)
        return 0
    try:
        Path(path).write_text(source)
    except OSError as exc:
        print(f"error: {path}: cannot write the app: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {name}'s app to {path}; serve it with `prismserve serve {path}`", file=sys.stderr)
    return 0
