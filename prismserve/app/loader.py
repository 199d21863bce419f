"""Loading an app file: compile, import, validate; every problem reported in one clear line."""

from __future__ import annotations

import collections.abc
import hashlib
import inspect
import re
import sys
import traceback
import typing
from pathlib import Path
from types import ModuleType
from typing import Any, TypeGuard

from pydantic import BaseModel, ValidationError

from prismserve.app.app import App
from prismserve.app.config import SLO, AppConfig, Autoscale
from prismserve.errors import AppLoadError
from prismserve.task import Task, TaskDefinitionError

MODALITIES = frozenset({"text", "image", "audio", "video"})
# A hub id too (`Qwen/Qwen2.5-Omni-7B`): '/'-separated segments of letters, digits, '.', '_', '-',
# each starting with a letter or digit (so no '', '.' or '..' segment), 128 characters at most.
APP_NAME = re.compile(r"^(?=.{1,128}$)[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_STREAM_ORIGINS = {
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.AsyncGenerator,
}


def load_app(path: str | Path, name: str | None = None) -> App:
    """Load and validate the app in `path`; its name defaults to the file's stem."""
    path = Path(path)
    try:
        source = path.read_text()
    except OSError as exc:
        raise AppLoadError(f"{path}: cannot read app file: {exc.strerror or exc}") from None
    return load_app_source(source, name or path.stem, filename=str(path))


def load_app_source(source: str, name: str, filename: str = "<app>") -> App:
    """Load and validate an app from its source text."""
    if not APP_NAME.match(name):
        raise AppLoadError(
            f"{filename}: app name {name!r} is invalid: use letters, digits, '.', '_' or '-' (up to 128), "
            "starting with a letter or digit, in '/'-separated parts such as a hub id (Qwen/Qwen2.5-Omni-7B)"
        )
    module = _execute(source, name, filename)
    tasks = _config_tasks(module, filename)
    serve, request_model, response_model, streaming = _serve_signature(module, filename)
    app = App(name, module, module.Config, tasks, serve, request_model, response_model, streaming)
    _check_serving(app, filename)
    return app


def _module_name(name: str) -> str:
    """The app module's name in sys.modules: the app name as an identifier, with a digest of the name
    when characters other than '-' had to be replaced (`a/b` and `a_b` stay apart)."""
    plain = name.replace("-", "_")
    ident = re.sub(r"\W", "_", plain)
    if ident != plain:
        ident += "_" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"prismserve_app_{ident}"


def _execute(source: str, name: str, filename: str) -> ModuleType:
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        raise AppLoadError(f"{filename}:{exc.lineno}: syntax error: {exc.msg}") from None
    module_name = _module_name(name)
    module = ModuleType(module_name)
    module.__file__ = filename
    # Registered so that pydantic can resolve the app's annotations and graphs can name its classes.
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except Exception as exc:  # noqa: BLE001 - any import-time failure of user code is reported
        if previous is None:
            del sys.modules[module_name]
        else:
            sys.modules[module_name] = previous
        line = next(
            (
                frame.lineno
                for frame in reversed(traceback.extract_tb(exc.__traceback__))
                if frame.filename == filename
            ),
            None,
        )
        where = f"{filename}:{line}" if line else filename
        if isinstance(exc, TaskDefinitionError):  # already says which task and what to fix
            raise AppLoadError(f"{where}: {exc}") from None
        raise AppLoadError(f"{where}: error while importing the app: {type(exc).__name__}: {exc}") from None
    return module


def _config_tasks(module: ModuleType, filename: str) -> dict[str, Task[Any, Any]]:
    config = getattr(module, "Config", None)
    if config is None:
        raise AppLoadError(
            f"{filename}: no `Config` found; declare a class Config deriving from prismserve.app.AppConfig "
            "that lists the app's tasks"
        )
    if not (inspect.isclass(config) and issubclass(config, AppConfig)):
        raise AppLoadError(f"{filename}: `Config` must be a class deriving from prismserve.app.AppConfig")
    tasks = config.tasks
    if not isinstance(tasks, dict) or not tasks:
        raise AppLoadError(f"{filename}: Config.tasks must be a non-empty dict of name -> task")
    for kind in ("input_modalities", "output_modalities"):
        value = getattr(config, kind)
        if not isinstance(value, (set, frozenset)) or not value <= MODALITIES:
            raise AppLoadError(f"{filename}: Config.{kind} must be a set drawn from {sorted(MODALITIES)}")
    for task_name, task in tasks.items():
        if not isinstance(task_name, str) or not isinstance(task, Task):
            raise AppLoadError(
                f"{filename}: Config.tasks[{task_name!r}] must map a string to a Task instance, "
                f"got {type(task).__name__}"
            )
    return dict(tasks)


def _check_serving(app: App, filename: str) -> None:
    """Refuse SLOs that are not SLOs and replica routing for deployments the app does not have."""
    from prismserve.task.routing import REPLICA_POLICIES

    slos = app.config.slos
    if not isinstance(slos, dict):
        raise AppLoadError(f"{filename}: Config.slos must be a dict of request type -> SLO")
    for kind, slo in slos.items():
        _check_chat_type(app, kind, filename)
        try:
            SLO.model_validate(slo)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = "".join(f".{part}" for part in error["loc"])
            raise AppLoadError(
                f"{filename}: Config.slos[{kind!r}]{field}: {error['msg']}; an SLO gives any of ttft_s, "
                "ttft_per_token_s, tbt_s and e2e_s (seconds)"
            ) from None
    names = app.named_unit_tasks()
    if app.config.autoscale is not None:
        _check_autoscale(app.config.autoscale, names, filename)
    for name, policy in app.config.replica_routing.items():
        if name not in names:
            raise AppLoadError(
                f"{filename}: Config.replica_routing names {name!r}, not a deployment of the app: "
                f"use one of {sorted(names)}"
            )
        if policy not in REPLICA_POLICIES:
            raise AppLoadError(
                f"{filename}: Config.replica_routing[{name!r}] is {policy!r}: use one of {', '.join(REPLICA_POLICIES)}"
            )


def _check_chat_type(app: App, kind: Any, filename: str) -> None:
    """Refuse an SLO for a chat app under a name no request of the app has (`ChatRequest.request_type`:
    its input modalities sorted and joined by '+', then `->audio` when speech is asked for), which
    would never apply; other apps name their request types themselves."""
    from prismserve.protocol.chat import ChatRequest

    if kind == "default" or not (
        isinstance(app.request_model, type) and issubclass(app.request_model, ChatRequest)
    ):
        return
    inputs, _, output = str(kind).partition("->")
    parts = inputs.split("+")
    valid = (
        "text" in parts
        and set(parts) <= app.config.input_modalities
        and (not output or (output == "audio" and "audio" in app.config.output_modalities))
    )
    canonical = "+".join(sorted(set(parts))) + (f"->{output}" if output else "")
    if not valid or canonical != kind:
        hint = f"write {canonical!r}" if valid else "name input modalities the app takes, 'text' among them"
        raise AppLoadError(
            f"{filename}: Config.slos names request type {kind!r}, which no chat request has: {hint} "
            "(input modalities sorted and joined by '+', then '->audio' for speech), or 'default'"
        )


def _check_autoscale(value: Any, names: dict[str, Any], filename: str) -> None:
    """Refuse autoscaling settings that do not parse or name deployments the app does not have."""
    try:
        autoscale = Autoscale.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = "".join(f".{part}" for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        raise AppLoadError(f"{filename}: Config.autoscale{field}: {message}") from None
    named = {*autoscale.stages, *autoscale.capacity, *autoscale.min_replicas, *autoscale.max_replicas}
    unknown = sorted(named - set(names))
    if unknown:
        raise AppLoadError(
            f"{filename}: Config.autoscale names {unknown}, not deployments of the app: use names from {sorted(names)}"
        )


def _serve_signature(module: ModuleType, filename: str) -> tuple[Any, type[BaseModel], type[BaseModel], bool]:
    serve = getattr(module, "serve", None)
    if serve is None or not inspect.isfunction(serve):
        raise AppLoadError(f"{filename}: no `async def serve(request)` function found")
    streaming_fn = inspect.isasyncgenfunction(serve)
    if not (streaming_fn or inspect.iscoroutinefunction(serve)):
        raise AppLoadError(f"{filename}: serve must be declared `async def serve(request)`")
    params = list(inspect.signature(serve).parameters.values())
    if len(params) != 1 or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise AppLoadError(f"{filename}: serve must take exactly one argument, the request")
    try:
        hints = typing.get_type_hints(serve)
    except Exception as exc:  # noqa: BLE001 - unresolvable annotations
        raise AppLoadError(f"{filename}: cannot resolve serve's annotations: {exc}") from None
    request_model = hints.get(params[0].name)
    if not _is_model(request_model):
        raise AppLoadError(
            f"{filename}: serve's request parameter must be annotated with a pydantic model, got {request_model!r}"
        )
    if "return" not in hints:
        raise AppLoadError(
            f"{filename}: annotate serve's return type: a pydantic model, or AsyncIterator[Model] when streaming"
        )
    returned = hints["return"]
    streaming = typing.get_origin(returned) in _STREAM_ORIGINS
    response_model = typing.get_args(returned)[0] if streaming and typing.get_args(returned) else returned
    if streaming_fn and not streaming:
        raise AppLoadError(f"{filename}: serve yields, so its return type must be AsyncIterator[Model]")
    if not _is_model(response_model):
        what = "streamed chunk" if streaming else "response"
        raise AppLoadError(
            f"{filename}: serve's {what} type must be a pydantic model, got {response_model!r}"
        )
    return serve, request_model, response_model, streaming


def _is_model(tp: Any) -> TypeGuard[type[BaseModel]]:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)
