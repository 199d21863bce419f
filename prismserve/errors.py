"""Every error prismserve raises on purpose, in one hierarchy, each class with the HTTP answer it gets.

`status` and `kind` (the error body's `type`) are what the gateway answers when the error reaches it
(`prismserve.gateway.errors.as_http_error` reads them; nothing else maps errors to statuses).
`public` says whether the message is meant for the client: a user error's message says what to fix;
a server error's text may name Ray actors, pids and addresses, so the client gets only the failing
component and the request id, and the log gets the rest.

Every room may import this module: it imports nothing of prismserve. Classes keep a builtin base
where callers catch one (an InvalidInputError is a ValueError, a DispatchError a RuntimeError).
"""

from __future__ import annotations

from typing import ClassVar


class PrismserveError(Exception):
    """Base of every error prismserve raises on purpose; unless a subclass says otherwise, a server fault."""

    status: ClassVar[int] = 500
    kind: ClassVar[str] = "internal_error"
    public: ClassVar[bool] = False
    # OpenAI's `error.code` string for this error (`invalid_api_key` …); None: the body's code is null.
    code: ClassVar[str | None] = None


# --- the client's errors (4xx): the message says what to fix ------------------------------------------


class UserError(PrismserveError):
    """Base of the errors a user causes: a request, an app file, a plan that cannot be served as given."""

    status = 400
    kind = "invalid_request_error"
    public = True


class InvalidRequestError(UserError, ValueError):
    """A request, app source, plan or option that cannot be served as written (malformed JSON, a
    field that does not validate, bad base64, a value outside what is supported)."""


class AuthError(UserError):
    """The admin API was called without the right bearer token."""

    status = 401
    kind = "auth_error"


class ApiKeyError(AuthError):
    """A /v1 route was called without the gateway's API key; typed as OpenAI types it."""

    kind = "invalid_request_error"
    code = "invalid_api_key"


class NotFoundError(UserError, LookupError):
    """A request names something that does not exist: an app, a route, a model."""

    status = 404
    kind = "not_found_error"


class ConflictError(UserError):
    """A request conflicts with the server's state: a name already taken, a plan the cluster cannot hold."""

    status = 409
    kind = "conflict_error"


class PayloadTooLargeError(UserError):
    """A request body is larger than the gateway's `max_request_bytes`."""

    status = 413
    kind = "payload_too_large_error"


class UnsupportedMediaTypeError(UserError):
    """A request body's Content-Type is not one the route takes (JSON)."""

    status = 415
    kind = "unsupported_media_type"


class UnavailableError(PrismserveError):
    """The server cannot serve this yet: something it needs is not installed or not running. The
    message says what, so the operator can fix it; it names no process internals."""

    status = 503
    kind = "unavailable_error"
    public = True


class AppResponseError(PrismserveError):
    """An app answered with a type the route cannot send (a stream where one answer was asked for, a
    ChatCompletion route given another type): the app's fault. The message names the app and the
    types only, so the client sees it."""

    kind = "app_error"
    public = True


# --- the task layer -------------------------------------------------------------------------------------


class TaskError(PrismserveError):
    """Base class of every error the task layer raises on purpose; unless a subclass says otherwise,
    the fault of the app's code (a 500 of type `app_error`)."""

    kind = "app_error"


class TaskDefinitionError(TaskError, TypeError):
    """A task class is declared in a way prismserve cannot run (async invoke, overridden unit invoke …)."""


class TaskUsageError(TaskError, RuntimeError):
    """A task is used outside the way it runs (invoke called directly, no dispatcher set …)."""


class RecordError(TaskError, RuntimeError):
    """A composite's invoke touched a placeholder's value during record."""


class ReplayDivergenceError(TaskError, RuntimeError):
    """Replay took a different path through the unit tasks than record did."""


class InvalidInputError(TaskError, InvalidRequestError):
    """A request's content cannot be served (undecodable media, a modality the model lacks): the
    client's fault, reported as a 400, not as a failed executor."""

    status = 400
    kind = "invalid_input"


class ContextLengthError(InvalidInputError):
    """A request whose prompt, or prompt and `max_tokens`, do not fit the model's context."""

    code = "context_length_exceeded"


class DispatchError(TaskError, RuntimeError):
    """A unit-task invocation of a graph could not be executed: a 502 naming the call and component.

    `call` (the invocation's index in its graph) and `component` (its unit task's class) are what the
    client is told failed; the message, which may name replicas and actors, goes to the log.
    """

    status = 502
    kind = "executor_error"

    def __init__(self, message: str, *, call: int | None = None, component: str | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.component = component

    @classmethod
    def at(cls, call: int, component: str, what: str) -> DispatchError:
        """The error of call #`call` to `component`; the message reads `call #N (Component) <what>`."""
        return cls(f"call #{call} ({component}) {what}", call=call, component=component)

    def failed_part(self) -> str:
        """What the client is told failed: `call #N (Component)`, or `an executor` when unknown."""
        if self.call is None:
            return "an executor"
        return f"call #{self.call} ({self.component})" if self.component else f"call #{self.call}"


# --- the runtime ----------------------------------------------------------------------------------------


class ReplicaDied(DispatchError):
    """A replica died while holding an invocation."""


class InputLost(ReplicaDied):
    """An invocation's input was lost with the replica that produced it."""


class StreamReadError(DispatchError):
    """The producer of a stream failed or was lost; carries the producer's call and component."""

    @classmethod
    def of(cls, error: DispatchError) -> StreamReadError:
        """The reader's error for a producer that failed with `error` (its message, call and component)."""
        return cls(str(error), call=error.call, component=error.component)


class ReplicaGone(PrismserveError, RuntimeError):
    """A replica stopped or died while a call on it was open (its connection dropped, or it was
    stopped in process); the dispatcher turns it into ReplicaDied or InputLost by `actor_id`."""

    def __init__(self, actor_id: str) -> None:
        super().__init__(f"replica {actor_id} is gone")
        self.actor_id = actor_id

    def __reduce__(self) -> tuple[type[ReplicaGone], tuple[str]]:
        return type(self), (self.actor_id,)


class ReplicaStartError(PrismserveError, RuntimeError):
    """A replica's actor did not come up."""

    status = 502
    kind = "executor_error"


class NoReplicaError(PrismserveError, RuntimeError):
    """A deployment has no replica that can take an invocation."""

    status = 503
    kind = "unavailable_error"


class PlacementError(ConflictError, ValueError):
    """A cell cannot be placed on the cluster; the message says what is missing."""

    kind = "capacity_error"


class ExecutorUnhealthy(PrismserveError, RuntimeError):
    """An executor cannot serve any more; its replica should be restarted."""


class EnvironmentMissing(UnavailableError, RuntimeError):
    """An executor's Python environment is not built; the message says how to build it."""

    kind = "environment_error"


# --- apps, models, plans, workloads ---------------------------------------------------------------------


class AppLoadError(InvalidRequestError):
    """An app file cannot be served; the message says where and what to fix."""


class AppRegistryError(UserError, ValueError):
    """An app cannot be registered or unregistered as asked (catch this for either case below)."""


class UnknownAppError(AppRegistryError, NotFoundError):
    """No app of that name is registered; the message lists those that are."""

    code = "model_not_found"  # apps are what `model` names


class AppExistsError(AppRegistryError, ConflictError):
    """An app of that name is registered already."""


class MediaError(InvalidRequestError):
    """Media a model cannot take: undecodable bytes, or a modality the checkpoint has no encoder for."""

    kind = "invalid_input"


class UnknownModelError(NotFoundError, ValueError):
    """A checkpoint whose family no adapter handles, or that cannot be found."""


class PlannerError(InvalidRequestError):
    """Base of the planner's errors."""


class SpecError(PlannerError):
    """The plan spec is malformed or inconsistent."""


class InfeasibleError(PlannerError):
    """No deployment meets the request (budget too small, no instance fits …): valid, but more than the
    cluster or budget holds."""

    status = 409
    kind = "capacity_error"


class WorkloadError(InvalidRequestError):
    """A workload cannot be built: a missing data file, an unknown name, bad parameters."""
