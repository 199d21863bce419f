"""GPUs per replica of a composite's components: the `gpus` setting of MLLMTask, OmniTask and
ImageGenTask, handed down to the unit tasks they build."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prismserve.task import TaskDefinitionError, UnitTask


def component_gpus(
    owner: str, gpus: Mapping[str, float], components: Mapping[str, type[UnitTask[Any, Any]]]
) -> dict[str, float]:
    """GPUs per replica of each of `owner`'s `components` (name -> the unit-task class it builds):
    as `gpus` sets them, else the class's default. A name that is not one of the components this
    configuration builds is refused: a share given to a component that is not deployed would leave
    its GPU idle unnoticed."""
    unknown = sorted(set(gpus) - set(components))
    if unknown:
        raise TaskDefinitionError(
            f"{owner}: gpus names {', '.join(map(repr, unknown))}, not a component it deploys; "
            f"its components are {', '.join(map(repr, components))}"
        )
    return {name: gpus.get(name, cls.default_gpus) for name, cls in components.items()}
