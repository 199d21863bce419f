"""`prismserve serve`: start the runtime and the gateway, register an app (an app file, or the default
app of a model's family), apply a plan."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from prismserve.app import App, AppLoadError, AppRegistryError, load_app_source
from prismserve.errors import UnknownModelError, WorkloadError
from prismserve.gateway.durable import DurableState
from prismserve.gateway.errors import validation_message
from prismserve.gateway.media import MediaPolicy
from prismserve.gateway.server import create_gateway
from prismserve.gateway.trace_recorder import TraceRecorder
from prismserve.models.family import EngineSettings, SettingError
from prismserve.observability import setup_logging, setup_tracing
from prismserve.observability.logs import FORMATS as LOG_FORMATS
from prismserve.planner import Plan
from prismserve.runtime import LocalRuntime, Runtime, create_runtime
from prismserve.runtime.replica import freeze_heap
from prismserve.runtime.resources import PlacementError
from prismserve.task.context import current_request

if TYPE_CHECKING:
    import uvicorn
    from opentelemetry.sdk.trace import TracerProvider

    from prismserve.control import Controls
    from prismserve.profile.budgets import Budgets

TOKEN_VARIABLE = "PRISMSERVE_ADMIN_TOKEN"
API_KEY_VARIABLE = "PRISMSERVE_API_KEY"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass
class ServeOptions:
    """What `prismserve serve` was asked to do. `target` is an app file (`*.py`, or any existing file)
    or a model: a checkpoint directory or a hub id, served by its family's default app."""

    target: str
    name: str | None = None
    plan_path: str | None = None
    gpus: int | str | None = None  # plan for this many GPUs ("all": the cluster's) at start
    profile_workload: str = "any2any"
    replan: bool = True  # with gpus: re-plan as the traffic's mix drifts
    budgets_path: str | None = None  # batching budgets `prismserve profile` measured, set on the deployments
    fake_gpus: int | None = None
    address: str | None = None
    routing: str = "static"
    host: str = "127.0.0.1"
    port: int = 8000
    in_process: bool = False
    offline: bool = False
    engine: EngineSettings = field(default_factory=EngineSettings)
    log_level: str = "warning"
    log_format: str = "text"
    access_log: bool = True
    api_key: str | None = None
    allowed_media_domains: tuple[str, ...] | None = None
    record_trace: str | None = None  # append one JSON line per answered chat request (trace replay)
    state: str | None = None  # the admin API's changes kept in this file and restored at start
    component_gib: dict[str, float] = field(
        default_factory=dict
    )  # GiB a fitted component needs (`serve.fit`)

    @property
    def is_app_file(self) -> bool:
        """Whether `target` is an app file rather than a model."""
        return self.target.endswith(".py") or Path(self.target).is_file()


class StartupError(Exception):
    """The server cannot start as asked; the message says why."""


def run_server(options: ServeOptions, *, runtime: Runtime | None = None) -> int:
    """Serve until interrupted (Ctrl-C, SIGTERM); returns the exit code."""
    try:
        server = prepare_server(options, runtime=runtime)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Until the runtime has started, SIGTERM stops as Ctrl-C does; GatewayServer.serve takes over then.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return asyncio.run(server.serve())
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled; the runtime is closed by then
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _load_budgets(path: str | None, app: App) -> Budgets | None:
    """The batching budgets at `path` (None: none asked for), checked against the app before anything starts."""
    from prismserve.errors import InvalidRequestError
    from prismserve.profile.budgets import apply_budgets, load_budgets

    if path is None:
        return None
    try:
        budgets = load_budgets(Path(path))
        apply_budgets(app, budgets)  # on the copy loaded to check the app: refuse budgets of another app now
    except InvalidRequestError as exc:
        raise StartupError(f"--budgets: {exc}") from None
    return budgets


def _recorder(options: ServeOptions) -> TraceRecorder | None:
    """The trace recorder `--record-trace` asks for; a path that cannot be opened stops the start."""
    if options.record_trace is None:
        return None
    try:
        return TraceRecorder(options.record_trace)
    except OSError as exc:
        raise StartupError(
            f"--record-trace {options.record_trace}: cannot append to it: {exc.strerror or exc}"
        ) from None


def _durable(options: ServeOptions) -> DurableState | None:
    """The state file `--state` names; one that cannot be read stops the start."""
    if options.state is None:
        return None
    try:
        return DurableState(options.state)
    except ValueError as exc:
        raise StartupError(f"--state: {exc}") from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def prepare_server(options: ServeOptions, *, runtime: Runtime | None = None) -> GatewayServer:
    """Everything that can fail before the runtime starts: the app file, the plan, the port, the runtime's options."""
    import uvicorn

    if options.log_level not in LOG_LEVELS:
        raise StartupError(f"--log-level {options.log_level!r}: use one of {', '.join(LOG_LEVELS)}")
    if options.log_format not in LOG_FORMATS:
        raise StartupError(f"--log-format {options.log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    if options.api_key == "":
        raise StartupError(
            f"the API key is empty: give --api-key (or {API_KEY_VARIABLE}) a value, or neither"
        )
    source, name, filename = app_source(options)
    try:
        app = load_app_source(source, name, filename=filename)  # report a bad app before anything starts
    except AppLoadError as exc:
        raise StartupError(str(exc)) from None
    if options.gpus is not None and options.plan_path is not None:
        raise StartupError("--plan deploys a plan given; --gpus plans one: give one of them")
    if options.gpus is not None and options.in_process:
        raise StartupError("--in-process runs one replica per deployment: it cannot deploy a plan for --gpus")
    if options.gpus is not None:
        from prismserve.profile import check_workload

        try:
            check_workload(options.profile_workload)
        except WorkloadError as exc:
            raise StartupError(f"--profile-workload: {exc}") from None
    plan = _load_plan(options.plan_path)
    budgets = _load_budgets(options.budgets_path, app)
    refit = _refit(options, app, filename)
    runtime = runtime or _runtime(options)
    chosen = os.environ.get(TOKEN_VARIABLE, "")
    token = chosen or secrets.token_urlsafe(24)
    provider = setup_tracing("prismserve-gateway")  # only when OTEL_EXPORTER_OTLP_ENDPOINT is set
    gateway = create_gateway(
        runtime,
        admin_token=token,
        api_key=options.api_key,
        media=_media(options),
        trace=_recorder(options),
        durable=_durable(options),
    )
    listener = _listen(options.host, options.port)
    setup_logging(options.log_level, options.log_format, lambda: current_request().id)
    config = uvicorn.Config(
        gateway,
        log_level=options.log_level,
        access_log=options.access_log,
        lifespan="off",
        timeout_graceful_shutdown=10,
    )
    return GatewayServer(
        runtime=runtime,
        app_name=app.name,
        source=source,
        filename=filename,
        app=app,
        plan=plan,
        budgets=budgets,
        plan_gpus=options.gpus,
        profile_workload=options.profile_workload,
        replan=options.replan,
        refit=refit,
        token=token,
        token_generated=not chosen,
        server=uvicorn.Server(config),
        listener=listener,
        tracer_provider=provider,
    )


@dataclass
class GatewayServer:
    """A gateway ready to serve: its runtime, the app to register and plan to apply, its socket."""

    runtime: Runtime
    app_name: str
    source: str
    filename: str
    app: App
    plan: Plan | None
    token: str
    token_generated: bool
    server: uvicorn.Server
    listener: socket.socket
    tracer_provider: TracerProvider | None = None
    plan_gpus: int | str | None = None  # plan for this many GPUs at start ("all": the cluster's)
    budgets: Budgets | None = None  # batching budgets set on the app's deployments before they start
    profile_workload: str = "any2any"
    replan: bool = True  # watch the traffic of a plan made at start and re-plan as it drifts
    # A model's default app laid onto the cluster's GPUs once they are known (`_refit`), if it may be.
    refit: Callable[[Runtime], tuple[str, App, dict[str, float], int] | None] | None = None

    @property
    def url(self) -> str:
        """The base URL the gateway answers on."""
        host, port = self.listener.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    @property
    def controls(self) -> Controls:
        """The control loops of the gateway uvicorn serves."""
        return self.server.config.app.state.gateway.controls  # type: ignore[union-attr]

    async def serve(self) -> int:
        """Start the runtime, register the app, apply the plan, serve until stopped; returns the exit code."""
        serving = False
        try:
            if not await _reported(self.runtime.start()):
                return 2
            with self._stopped_by_sigterm():  # only now: starting Ray replaced the SIGTERM handler
                if not await _reported(self._register()):
                    return 2
                serving = True
                freeze_heap()  # as each replica does once loaded (in-process replicas live here)
                self._announce()
                await self.server.serve(sockets=[self.listener])
            return 0
        finally:
            self.listener.close()
            # Ctrl-C: uvicorn hands the signal back once it has stopped, and asyncio's runner then
            # cancels this task; the runtime must still close (replicas, models) before we exit.
            await self.controls.close()
            cancelled = await _to_the_end(self.runtime.close())
            if self.tracer_provider is not None:
                self.tracer_provider.shutdown()  # flush spans still queued for the OTLP exporter
            if serving:
                print("prismserve: stopped", flush=True)
            if cancelled:
                raise asyncio.CancelledError

    async def _register(self) -> None:
        from prismserve.profile.budgets import apply_budgets

        fitted = self.refit(self.runtime) if self.refit is not None else None
        if fitted is not None:
            self.source, self.app, shares, gpus = fitted
            layout = ", ".join(f"{component} {share:g}" for component, share in shares.items())
            packed = f"{gpus} GPU{'s' if gpus > 1 else ''}: {layout}"
            if self.plan_gpus is None:
                print(f"prismserve: {self.app_name!r} shares {packed}", file=sys.stderr)
            else:
                print(f"prismserve: {self.app_name!r} is profiled packed on {packed}", file=sys.stderr)
        budgets = self.budgets
        prepare = None if budgets is None else (lambda loaded: apply_budgets(loaded, budgets))
        app = await self.runtime.register_app(
            self.source, self.app_name, filename=self.filename, prepare=prepare
        )
        if self.plan is not None:
            await self.runtime.deploy(self.app_name, self.plan)
        durable = self.server.config.app.state.gateway.durable  # type: ignore[union-attr]
        if durable is not None:
            restored = await durable.restore(self.runtime, self.controls)
            if restored:
                print(f"prismserve: restored from {durable.path}: {', '.join(restored)}", file=sys.stderr)
        if self.plan_gpus is not None:
            await self._plan(app)
        self.controls.registered(app)

    async def _plan(self, app: App) -> None:
        """Profile, plan for the GPUs asked for and deploy; then (`replan`) re-plan as the traffic drifts."""
        from prismserve.control import Replanner
        from prismserve.profile import deployable, plan_at_start

        gpus = None if self.plan_gpus == "all" else int(self.plan_gpus)  # type: ignore[arg-type]
        spec, plan, budget = await plan_at_start(self.runtime, app, self.source, gpus, self.profile_workload)
        if not self.replan:
            return
        replanner = Replanner(
            self.runtime,
            app.name,
            spec,
            gpus=budget,
            plan=plan,
            plan_to_deployment=lambda p: deployable(p, spec, app),
        )
        self.controls.watch(replanner)
        replanner.start()

    def _announce(self) -> None:
        model = getattr(self.app.module, "MODEL", None)
        checkpoint = f" ({model})" if isinstance(model, str) else ""
        print(f"prismserve: serving app {self.app_name!r}{checkpoint} at {self.url}", flush=True)
        if self.token_generated:
            print(
                f"prismserve: admin token (shown once; set {TOKEN_VARIABLE} to choose it): {self.token}",
                flush=True,
            )

    @contextlib.contextmanager
    def _stopped_by_sigterm(self) -> Iterator[None]:
        """SIGTERM stops the server as cleanly as Ctrl-C. Entered once the runtime has started, because
        `ray.init` replaces the SIGTERM handler with one that exits at once with status 15; uvicorn
        hands the signal on to this handler when it has shut down."""
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: self.stop())
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def stop(self) -> None:
        """Ask the server to finish its requests and stop (what Ctrl-C does)."""
        self.server.should_exit = True


async def _to_the_end(work: Awaitable[None]) -> bool:
    """Await `work` to its end even when this task is cancelled meanwhile; whether it was."""
    done = asyncio.ensure_future(work)
    cancelled = False
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            cancelled = True
    done.result()
    return cancelled


async def _reported(step: Awaitable[object]) -> bool:
    """Run a start-up step; False, with the error printed, if it fails in a way the user can fix."""
    try:
        await step
    except (AppLoadError, AppRegistryError, PlacementError, ValueError, ConnectionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def app_source(options: ServeOptions) -> tuple[str, str, str]:
    """The app to register: its source, name and file name. An app file is read as it is; a model is
    resolved to a local checkpoint (downloaded from the hub if need be) served by its family's default
    app (`prismserve.apps`)."""
    if options.is_app_file:
        given = [flag for flag, value in _engine_flags(options.engine) if value is not None]
        given += ["--component-gib"] if options.component_gib else []
        if given:
            raise StartupError(
                f"{', '.join(given)} configure{'s' if len(given) == 1 else ''} the default app of a model "
                "(prismserve serve MODEL); "
                f"{options.target} sets its tasks' engines itself"
            )
        try:
            source = Path(options.target).read_text()
        except OSError as exc:
            raise StartupError(f"{options.target}: cannot read app file: {exc.strerror or exc}") from None
        return source, options.name or Path(options.target).stem, options.target
    from prismserve.apps import default_app_source
    from prismserve.models import family_for
    from prismserve.models.hub import local_checkpoint, resolve_checkpoint

    try:
        local = local_checkpoint(options.target)
        checkpoint = resolve_checkpoint(options.target, offline=options.offline)
        family = family_for(str(checkpoint))
        source = default_app_source(family, str(checkpoint), options.engine)
    except (UnknownModelError, SettingError) as exc:
        raise StartupError(str(exc)) from None
    name = options.name or (local.name if local is not None else options.target)
    return source, name, f"<{family.name} app for {options.target}>"


def _refit(
    options: ServeOptions, app: App, filename: str
) -> Callable[[Runtime], tuple[str, App, dict[str, float], int] | None] | None:
    """For a model's default app whose components each take a whole GPU (no app file, plan or GPU
    flag decides otherwise): what lays them onto fewer GPUs, once the runtime has started and knows
    the cluster (`serve.fit`): the new source, app, shares and GPU count, or None when they stay
    whole. Served as it is, on fewer GPUs than components, they share the cluster's GPUs. Planned
    for fewer GPUs than components (`--gpus`), they are packed onto the fewest GPUs that hold them,
    so that the profile measures that packing and the planner may colocate them
    (`fit.planning_shares`). Planned for more, each keeps a GPU: on declared GPUs the planner's model
    of the shared CPUs over-predicts a plan of colocated replicas (the tiny Omni for 8 GPUs was
    planned as two of everything together: 0.54 and 0.84 of its predicted rate measured, against 1.03
    and 1.02 for the plan of whole GPUs)."""
    engine = options.engine
    decided = options.plan_path is not None or options.in_process
    if options.is_app_file or decided or engine.gpu_memory_utilization or engine.tensor_parallel_size:
        return None
    components = {path.rsplit(".", 1)[-1]: task.gpus for path, task in app.named_unit_tasks().items()}
    checkpoint = getattr(app.module, "MODEL", None)
    if any(gpus != 1 for gpus in components.values()) or not isinstance(checkpoint, str):
        return None

    def refit(runtime: Runtime) -> tuple[str, App, dict[str, float], int] | None:
        from prismserve.apps import default_app_source
        from prismserve.models import family_for
        from prismserve.serve.fit import fitted_shares, gpu_memory_gib, planning_shares

        resources = getattr(runtime, "resources", None)
        gpus = int(sum(resources.inventory().values())) if resources is not None else 0
        if gpus < 1:
            return None  # no GPU at all: the runtime says so as it places them
        family = family_for(checkpoint)
        if options.gpus is not None:
            budget = gpus if options.gpus == "all" else int(options.gpus)
            if budget >= len(components):
                return None  # whole GPUs each (see the docstring)
            shares, gpus = planning_shares(
                family, checkpoint, list(components), gpu_memory_gib(), options.component_gib
            )
        else:
            shares = fitted_shares(
                family, checkpoint, list(components), gpus, gpu_memory_gib(), options.component_gib
            )
        if not shares:
            return None
        source = default_app_source(family, checkpoint, engine, gpus=shares)
        return source, load_app_source(source, app.name, filename=filename), shares, gpus

    return refit


def _engine_flags(settings: EngineSettings) -> list[tuple[str, object]]:
    return [("--" + key.replace("_", "-"), value) for key, value in settings.model_dump().items()]


def _media(options: ServeOptions) -> MediaPolicy | None:
    if options.allowed_media_domains is None:
        return None
    return MediaPolicy(allowed_domains=options.allowed_media_domains)


def _runtime(options: ServeOptions) -> Runtime:
    if options.in_process:
        if options.address or options.fake_gpus is not None:
            raise StartupError(
                "--in-process runs everything in this process: it takes neither --address nor --fake-gpus"
            )
        return LocalRuntime()
    try:
        return create_runtime(address=options.address, fake_gpus=options.fake_gpus, policy=options.routing)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def _load_plan(path: str | None) -> Plan | None:
    if path is None:
        return None
    try:
        return Plan.model_validate(json.loads(Path(path).read_text()))
    except OSError as exc:
        raise StartupError(f"{path}: cannot read plan: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise StartupError(f"{path}: malformed JSON: {exc}") from None
    except ValidationError as exc:
        raise StartupError(f"{path}: invalid plan: {validation_message(exc)}") from None


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, so that a busy port is reported before the runtime starts, and
    listening: a client that connects once "serving app … at URL" is printed waits in the backlog
    until uvicorn accepts, rather than being refused while uvicorn starts."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)  # uvicorn's backlog
    except OSError as exc:
        listener.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    listener.set_inheritable(True)
    return listener
