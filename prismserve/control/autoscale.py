"""Per-stage autoscaling (ModServe, 003 §4.2): replicas per stage from its token load and capacity.

Each stage (a deployment an app names in `Config.autoscale`) needs ceil(load / capacity) replicas,
its load the tokens/s its calls carry (counted by its task manager as leases are taken: demand, not
completions) and its capacity the tokens/s one replica serves within the SLO. The autoscaler looks
every `interval_s`: a stage over capacity scales out at once; one that a replica fewer would serve
below `scale_in_utilization` for `scale_in_after_s` in a row scales in (hysteresis); SLO attainment
below target adds a replica to the busiest stage (once per SLO window) and holds scale-ins. A change is a new plan — the
deployed one with the stages' own cells counted anew — applied through the runtime's plan diff:
cells added start before any is drained, cells removed drain their requests before they go.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prismserve.app import App, Autoscale
from prismserve.control.periodic import Periodic
from prismserve.control.runtime_control import RuntimeControl
from prismserve.control.slo import SLOWindow
from prismserve.planner import CellPlan, Plan

log = logging.getLogger(__name__)

# A `sim` replica's capacity within the SLO, as a share of its full-batch rate: queues grow without
# bound near saturation, and the SLO is missed well before.
SIM_UTILIZATION = 0.8


@dataclass
class _Stage:
    """What the autoscaler keeps of one stage: its token counts over the window, and since when it
    could do with a replica fewer."""

    key: str
    samples: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens so far)
    low_since: float | None = None


@dataclass(frozen=True)
class AutoscaleStatus:
    """What the metrics show of an autoscaler: replicas and load (tokens/s) per stage, changes made."""

    replicas: dict[str, int]
    load: dict[str, float]
    changes: int


class Autoscaler(Periodic):
    """Scales the stages of one app (`app.autoscale`) on `runtime`, which must place cells (the Ray
    runtime). `slo` is the window of the app's SLO outcomes (None: no attainment trigger)."""

    def __init__(
        self,
        runtime: RuntimeControl,
        app: App,
        slo: SLOWindow | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = app.autoscale
        if settings is None:
            raise ValueError(f"app {app.name!r} declares no autoscaling (Config.autoscale)")
        self.runtime = runtime
        self.app = app
        self.settings: Autoscale = settings
        self.slo = slo
        self.clock = clock
        self.changes = 0
        names = app.named_unit_tasks()
        self.stages = {name: _Stage(names[name].deployment_key()) for name in settings.stages}
        self._unknown: set[str] = (
            set()
        )  # what was warned of once: stages without a capacity, plans of options
        self._slo_added_at: float | None = None  # when missed SLOs last added a replica
        self.interval_s = settings.interval_s
        self.what = f"autoscaling {app.name}"
        self.last_load: dict[str, float] = {}  # tokens/s per stage at the last check

    def capacity(self, name: str) -> float | None:
        """Tokens/s one replica of stage `name` serves within the SLO: the app's figure, else its
        `sim` profile's full-batch rate at `SIM_UTILIZATION`; None (warned once) for neither."""
        given = self.settings.capacity.get(name)
        if given is not None:
            return given
        full = self.runtime.full_batch_rate(self.stages[name].key)
        if full is not None:
            return SIM_UTILIZATION * full
        if name not in self._unknown:
            self._unknown.add(name)
            log.warning(
                "autoscaling %s leaves %s alone: give Config.autoscale.capacity[%r], the tokens/s one replica "
                "serves within the SLO (only a sim replica's is read from its profile)",
                self.app.name,
                name,
                name,
            )
        return None

    async def check(self) -> dict[str, int] | None:
        """Sample the stages' load; deploy a plan with the replicas they need if that differs from
        the deployed one. Returns the replicas deployed, or None when nothing changed."""
        now = self.clock()
        plan = self.deployed()
        if plan.options:  # cells of deployment options (`serve --gpus`): its re-planning sizes them
            if "options" not in self._unknown:
                self._unknown.add("options")
                log.warning(
                    "autoscaling %s stops: its plan is of deployment options, re-planned as its traffic drifts",
                    self.app.name,
                )
            return None
        current = {name: _replicas(plan, name) for name in self.stages}
        load = self.last_load = self.load(now)
        wanted = self.wanted(now, current, load)
        wanted = self._within_budget(plan, wanted, current, load)
        if wanted == current:
            return None
        new = self.scaled(plan, wanted)
        rates = {name: round(rate) for name, rate in load.items()}
        log.info(
            "autoscaling %s: %s -> %s replicas (load %s tokens/s)", self.app.name, current, wanted, rates
        )
        await self.runtime.deploy(self.app.name, new)
        self.changes += 1
        for stage in self.stages.values():
            stage.low_since = None  # hysteresis starts afresh from the new replicas
        return wanted

    def wanted(self, now: float, current: dict[str, int], load: dict[str, float]) -> dict[str, int]:
        """The replicas each stage needs now, from `current` replicas and `load` (tokens/s), within
        its bounds (not yet the GPU budget)."""
        settings = self.settings
        attainment = self.slo.attainment() if self.slo is not None else None
        missing_slo = (
            attainment is not None
            and attainment < settings.attainment
            and self.slo is not None
            and self.slo.count() >= settings.min_requests
        )
        wanted = dict(current)
        capacity = {name: self.capacity(name) for name in load}
        for name, stage in self.stages.items():
            cap = capacity.get(name)
            if cap is None:
                continue  # not a full interval of samples yet, or no capacity known
            n, rate = current[name], load[name]
            if rate > n * cap:
                wanted[name] = math.ceil(rate / cap)
                stage.low_since = None
            elif n > 1 and rate < (n - 1) * cap * settings.scale_in_utilization and not missing_slo:
                stage.low_since = now if stage.low_since is None else stage.low_since
                if now - stage.low_since >= settings.scale_in_after_s:
                    wanted[name] = max(1, math.ceil(rate / (cap * settings.scale_in_utilization)))
            else:
                stage.low_since = None
        known = {name: load[name] / (max(1, current[name]) * cap) for name, cap in capacity.items() if cap}
        # Once per SLO window: the misses before a replica was added stay in the window a while.
        judged = (
            self._slo_added_at is None or self.slo is None or now - self._slo_added_at >= self.slo.window_s
        )
        if missing_slo and known and judged:
            busiest = max(known, key=known.__getitem__)
            wanted[busiest] = max(wanted[busiest], current[busiest] + 1)
            self._slo_added_at = now
        for name in wanted:
            low, high = settings.min_replicas.get(name, 1), settings.max_replicas.get(name, math.inf)
            wanted[name] = int(min(max(wanted[name], low), high))
        return wanted

    def _within_budget(
        self, plan: Plan, wanted: dict[str, int], current: dict[str, int], load: dict[str, float]
    ) -> dict[str, int]:
        """`wanted` with scale-outs given up, least utilised stage first, until `plan` scaled to it
        fits the GPU budget."""
        budget = self.settings.gpus or self.runtime.gpu_count()
        fitting = dict(wanted)
        growing = sorted(
            (s for s in wanted if wanted[s] > current[s]),
            key=lambda s: load.get(s, 0.0) / (max(1, current[s]) * (self.capacity(s) or 1.0)),
        )
        for name in growing:
            while fitting[name] > current[name] and self.scaled(plan, fitting).total_gpus > budget:
                fitting[name] -= 1
        if fitting != wanted:
            log.warning(
                "autoscaling %s: held at its GPU budget (%d GPUs): %s, not %s",
                self.app.name,
                budget,
                fitting,
                wanted,
            )
        return fitting

    def load(self, now: float) -> dict[str, float]:
        """Tokens/s each stage's calls carried over the last `window_s` (once an interval has passed)."""
        rates = {}
        for name, stage in self.stages.items():
            samples = stage.samples
            samples.append((now, self.runtime.tokens_leased(stage.key)))
            while len(samples) > 2 and samples[1][0] <= now - self.settings.window_s:
                samples.popleft()
            (then, before), (_, tokens) = samples[0], samples[-1]
            if now - then >= min(self.settings.interval_s, self.settings.window_s) * 0.999:
                rates[name] = (tokens - before) / (now - then)
        return rates

    def deployed(self) -> Plan:
        """The app's deployed plan; before any is, its cells as they are."""
        plan = self.runtime.plans.get(self.app.name)
        if plan is not None:
            return plan
        names = {task.deployment_key(): name for name, task in self.app.named_unit_tasks().items()}
        cells = [
            CellPlan(gpus=cell.gpus, replicas={names[k]: n for k, n in cell.replicas.items() if k in names})
            for cell in self.runtime.app_cells(self.app.name)
        ]
        return Plan(cells=cells)

    def scaled(self, plan: Plan, wanted: dict[str, int]) -> Plan:
        """`plan` with each stage's own cells (those holding only it) counted to give it `wanted`
        replicas; a stage without any gets cells of one replica."""
        cells = [cell.model_copy() for cell in plan.cells]
        for name, replicas in wanted.items():
            own = [c for c in cells if _only(c) == name]
            elsewhere = _replicas(plan, name) - sum(c.count * c.replicas[name] for c in own)
            if not own:
                task = self.app.named_unit_tasks()[name]
                own = [CellPlan(gpus=max(1, math.ceil(task.gpus)), count=0, replicas={name: 1})]
                cells.append(own[0])
            per_cell = own[0].replicas[name]
            for extra in own[1:]:
                extra.count = 0
            own[0].count = max(0, math.ceil((replicas - elsewhere) / per_cell))
        kept = [c for c in cells if c.count > 0]
        return plan.model_copy(update={"cells": kept})

    def status(self) -> AutoscaleStatus:
        """Replicas and the last check's load per stage, changes made."""
        plan = self.deployed()
        replicas = {name: _replicas(plan, name) for name in self.stages}
        return AutoscaleStatus(replicas, dict(self.last_load), self.changes)


def _replicas(plan: Plan, name: str) -> int:
    """Replicas of deployment `name` in `plan`."""
    return sum(cell.count * cell.replicas.get(name, 0) for cell in plan.cells)


def _only(cell: CellPlan) -> str | None:
    """The one deployment a cell holds, or None when it holds several (or none)."""
    held = [name for name, n in cell.replicas.items() if n]
    return held[0] if len(held) == 1 else None
