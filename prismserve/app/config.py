"""AppConfig: what an app file declares about itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SLO(BaseModel):
    """Latency targets of one request type, in seconds (None: no target): time to the first token
    or chunk (`ttft_s`, plus `ttft_per_token_s` for each token of the request's prompt, media
    included: a long prompt may take longer), mean time between tokens after it (`tbt_s`), and to
    the end (`e2e_s`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: float | None = Field(default=None, gt=0)
    ttft_per_token_s: float = Field(default=0.0, ge=0)
    tbt_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)

    def ttft_target_s(self, tokens: int) -> float | None:
        """The TTFT target of a request of `tokens` prompt tokens (None: no target)."""
        return None if self.ttft_s is None else self.ttft_s + self.ttft_per_token_s * tokens

    def first_due_s(self, tokens: int) -> float | None:
        """Seconds from arrival by which the first output of a request of `tokens` prompt tokens is
        due (what executor queues order by): its TTFT target, else its end-to-end target."""
        ttft = self.ttft_target_s(tokens)
        return ttft if ttft is not None else self.e2e_s

    def met(self, ttft_s: float, tbt_s: float | None, e2e_s: float, tokens: int = 0) -> bool:
        """Whether a request of `tokens` prompt tokens served with these latencies met every target."""
        ttft = self.ttft_target_s(tokens)
        return (
            (ttft is None or ttft_s <= ttft)
            and (self.tbt_s is None or tbt_s is None or tbt_s <= self.tbt_s)
            and (self.e2e_s is None or e2e_s <= self.e2e_s)
        )


class Autoscale(BaseModel):
    """Per-stage autoscaling (ModServe, 003 §4.2): each of `stages` (deployment names, as plans name
    them) runs ceil(load / capacity) replicas, its load the tokens/s its calls carried over the last
    `window_s` and `capacity[stage]` the tokens/s one replica serves within the SLO (for a `sim`
    replica: 80 % of its profile's full-batch rate when not given). Checked every `interval_s`:
    a stage above its capacity scales out at once; one below `scale_in_utilization` of a replica
    fewer, for `scale_in_after_s` in a row, scales in (hysteresis). SLO attainment below
    `attainment` over the gateway's last minute (at least `min_requests`) adds a replica to the
    busiest stage (once a minute) and holds every scale-in. Replicas stay within `min_replicas` (default 1) and
    `max_replicas`, the plan within `gpus` (default: the cluster's). Changes go through the plan's
    cell diff: new cells first, removed cells drained before they go."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: tuple[str, ...] = Field(min_length=1)
    capacity: dict[str, float] = Field(default_factory=dict)
    min_replicas: dict[str, int] = Field(default_factory=dict)
    max_replicas: dict[str, int] = Field(default_factory=dict)
    gpus: int | None = Field(default=None, ge=1)
    interval_s: float = Field(default=10.0, gt=0)
    window_s: float = Field(default=30.0, gt=0)
    scale_in_after_s: float = Field(default=60.0, ge=0)
    scale_in_utilization: float = Field(default=0.7, gt=0, le=1)
    attainment: float = Field(default=0.99, ge=0, le=1)
    min_requests: int = Field(default=50, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        for name, tokens_per_s in self.capacity.items():
            if not tokens_per_s > 0:
                raise ValueError(f"capacity[{name!r}] must be > 0 tokens/s, got {tokens_per_s}")
        for name, low in self.min_replicas.items():
            if low < 1:
                raise ValueError(f"min_replicas[{name!r}] must be >= 1, got {low}")
            high = self.max_replicas.get(name)
            if high is not None and high < low:
                raise ValueError(f"max_replicas[{name!r}] ({high}) is below min_replicas ({low})")
        for name, high in self.max_replicas.items():
            if high < 1:
                raise ValueError(f"max_replicas[{name!r}] must be >= 1, got {high}")
        return self


class AppConfig:
    """Subclass as the app file's `Config` class and list its tasks by name.

    `tasks` maps a name to each task the app's serve() calls; the unit tasks reachable from them
    are what gets deployed (equivalent unit tasks are deployed once, across apps too).
    `input_modalities` (text, image, audio, video) and `output_modalities` (text, audio) say what
    a chat app accepts and produces. `sim_values` maps a unit-task class to the function that
    computes its outputs when it runs on a `sim` executor (apps without weights, such as the tests'
    toys); other `sim` outputs are synthesised from the output type.
    """

    tasks: ClassVar[dict[str, Any]] = {}
    # What chat requests may carry and ask for; the gateway refuses others with a 4xx.
    input_modalities: ClassVar[frozenset[str]] = frozenset({"text"})
    output_modalities: ClassVar[frozenset[str]] = frozenset({"text"})
    sim_values: ClassVar[dict[type, Any]] = {}
    # Apps whose deployment options recording cannot reveal (emulated models on `sim` executors,
    # whose options are alternatives for the same components): `planner_spec(requests)` gives the
    # shape of the planner's spec for a workload's requests (`bench.workloads.RequestSpec`s: options,
    # request types, paths) and `deployment_plan(plan)` the runtime plan for a planner plan
    # (deployment names, sim profiles). `prismserve profile` and `serve --gpus` deploy one replica
    # of each option with it and measure every time of that shape on them (`profile/shaped.py`);
    # plain functions. None: the shape comes from recording the app.
    planner_spec: ClassVar[Callable[[list[Any]], Any] | None] = None
    deployment_plan: ClassVar[Callable[[Any], Any] | None] = None
    # SLOs by request type (`text`, `image+text` …; `default` for the types not named), as `SLO`s or
    # dicts of its fields: executor queues serve the call with the least slack to its request's
    # deadline first, and the gateway counts the requests that met theirs (goodput).
    slos: ClassVar[dict[str, Any]] = {}
    # Replica choice per deployment, by the names plans use (`model.encoders.image`): `static`,
    # `dynamic` (least loaded) or `tokens` (fewest pending tokens); the others follow `serve --routing`.
    replica_routing: ClassVar[dict[str, str]] = {}
    # Per-stage autoscaling while the app is served (an `Autoscale` or a dict of its fields; None: off).
    autoscale: ClassVar[Any] = None
    # The names a speaking app's `voice` may take, its default first (`GET /v1/audio/voices`): a
    # plain function, called when asked (the built-in Omni apps read their checkpoint's speakers).
    # None: the app does not say.
    voices: ClassVar[Callable[[], Sequence[str]] | None] = None
    # The most tokens a chat request's prompt and reply hold together: a `max_tokens` that cannot
    # fit is a 400 `context_length_exceeded` at the gateway. None: the smallest context the app's
    # LLM tasks state (`context_length()`: vLLM's `max_model_len`, a checkpoint's config), if any.
    context_length: ClassVar[int | None] = None
