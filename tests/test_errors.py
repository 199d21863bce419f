"""prismserve.errors: one definition per class, an HTTP status per class, structured dispatch errors."""

from __future__ import annotations

import ast
import pickle
from collections import Counter
from pathlib import Path

import pytest

import prismserve
from prismserve import errors
from prismserve.gateway.errors import as_http_error


def test_no_exception_class_name_is_defined_twice_in_the_package():
    root = Path(prismserve.__file__).parent
    names = Counter(
        node.name
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and (node.name.endswith(("Error", "Died", "Lost", "Missing")))
    )
    assert [name for name, count in names.items() if count > 1] == []


@pytest.mark.parametrize(
    "error, status, builtin",
    [
        (errors.InvalidInputError, 400, ValueError),
        (errors.MediaError, 400, ValueError),
        (errors.AppLoadError, 400, ValueError),
        (errors.SpecError, 400, ValueError),
        (errors.AuthError, 401, Exception),
        (errors.UnknownAppError, 404, ValueError),
        (errors.UnknownModelError, 404, ValueError),
        (errors.AppExistsError, 409, ValueError),
        (errors.PlacementError, 409, ValueError),
        (errors.PayloadTooLargeError, 413, Exception),
        (errors.UnsupportedMediaTypeError, 415, Exception),
        (errors.EnvironmentMissing, 503, RuntimeError),
        (errors.DispatchError, 502, RuntimeError),
        (errors.StreamReadError, 502, RuntimeError),
        (errors.RecordError, 500, RuntimeError),
    ],
)
def test_each_class_carries_its_status_and_keeps_the_builtin_callers_catch(error, status, builtin):
    assert error.status == status and issubclass(error, builtin) and issubclass(error, errors.PrismserveError)
    assert error.public == (status < 500 or status == 503)


def test_the_old_import_paths_name_the_same_classes():
    from prismserve.app import AppLoadError, AppRegistryError
    from prismserve.models import MediaError, UnknownModelError
    from prismserve.planner import PlannerError
    from prismserve.runtime.dispatcher import InputLost
    from prismserve.runtime.streams import StreamReadError
    from prismserve.task import DispatchError, InvalidInputError

    assert (AppLoadError, AppRegistryError, MediaError, UnknownModelError, PlannerError) == (
        errors.AppLoadError,
        errors.AppRegistryError,
        errors.MediaError,
        errors.UnknownModelError,
        errors.PlannerError,
    )
    assert (InputLost, StreamReadError, DispatchError, InvalidInputError) == (
        errors.InputLost,
        errors.StreamReadError,
        errors.DispatchError,
        errors.InvalidInputError,
    )


def test_a_dispatch_error_keeps_its_call_and_component_across_pickling_and_streams():
    error = pickle.loads(pickle.dumps(errors.ReplicaDied.at(3, "TalkerTask", "failed: ActorID(abc) died")))
    assert type(error) is errors.ReplicaDied and (error.call, error.component) == (3, "TalkerTask")
    assert str(error) == "call #3 (TalkerTask) failed: ActorID(abc) died"
    read = errors.StreamReadError.of(error)
    assert (read.call, read.component, str(read)) == (3, "TalkerTask", str(error))


def test_the_gateway_names_the_failed_call_from_attributes_not_from_the_text():
    error = errors.DispatchError("worker 10.0.0.7 pid=42 lost", call=2, component="VocoderTask")
    answer = as_http_error(error, "r1", "app 'omni'")
    assert answer.status == 502 and answer.kind == "executor_error"
    assert (
        answer.message.startswith("app 'omni': call #2 (VocoderTask) failed;")
        and "10.0.0.7" not in answer.message
    )
    unnamed = as_http_error(errors.DispatchError("call #9 (Fake) in the text only"), "r2", "app 'omni'")
    assert unnamed.message.startswith("app 'omni': an executor failed;")


def test_a_user_error_behind_another_error_is_answered_with_its_own_status_and_message():
    try:
        try:
            raise errors.UnknownModelError("no checkpoint at /m")
        except errors.UnknownModelError as cause:
            raise RuntimeError("loading failed") from cause
    except RuntimeError as error:
        answer = as_http_error(error, "r3", "app 'x'")
    assert (answer.status, answer.kind, answer.message) == (
        404,
        "not_found_error",
        "app 'x': no checkpoint at /m",
    )
