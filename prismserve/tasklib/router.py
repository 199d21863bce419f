"""Router: request-static routing over planned paths (000 §5.3, Listing 2)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, InstanceOf, model_validator

from prismserve.errors import InvalidRequestError
from prismserve.task import Task, replayable_choice
from prismserve.task.context import current_request
from prismserve.task.routing import Routing, planned_choice


class Router(Task[Any, Any]):
    """Samples one of `paths` per request from the plan's probabilities for its request type.

    `paths` maps path names (as in the plan, e.g. `E->L`) to composites that each run the whole
    request a different way. The probabilities come from the plan deployed for the app being served
    (`RequestContext.routing`, set by the runtime per request), else from
    `routing`; a request type they do not mention is spread evenly over all paths. The choice is made with
    `planned_choice` (the plan's split as smooth weighted round-robin, not independent draws),
    recorded as `replayable_choice` records, so replay follows the recorded path. Chat requests name their type
    (`ChatRequest.request_type`: `text`, `image+text` …); override `request_type` for others.
    """

    paths: dict[str, InstanceOf[Task]] = Field(min_length=1)
    routing: dict[str, dict[str, float]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_paths(self) -> Router:
        self.check_routing(self.routing)
        return self

    def check_routing(self, routing: Routing) -> None:
        """Raise InvalidRequestError if `routing` names a path this router does not have (checked on deploy)."""
        for request_type, probabilities in routing.items():
            unknown = sorted(set(probabilities) - set(self.paths))
            if unknown:
                raise InvalidRequestError(
                    f"routing[{request_type!r}] names paths {unknown}; the router has {sorted(self.paths)}"
                )

    def request_type(self, request: Any) -> str:
        """The plan's name for this request's type (a chat request's `request_type`, else `default`)."""
        return getattr(request, "request_type", "default")

    def invoke(self, request: Any) -> Any:
        names = list(self.paths)
        probabilities = (current_request().routing or self.routing).get(self.request_type(request))
        weights = [probabilities.get(n, 0.0) for n in names] if probabilities else None
        if weights is None:
            return self.paths[names[replayable_choice(len(names))]].invoke(request)
        # The plan's split realised evenly (smooth weighted round-robin), not by independent draws.
        index = planned_choice((id(self), self.request_type(request), tuple(names)), weights)
        return self.paths[names[index]].invoke(request)
