"""Re-planning while serving (000 §5.3): watch an app's request mix and rate, re-plan when they drift.

The planner plans for a mix of request types and a budget or a rate; the traffic that arrives has
its own. One `Replanner` per app is fed every request's type as the gateway serves it, keeps
sliding-window estimates of the rate and the mix, and every `interval_s` compares them with the
plan deployed: the distance between the observed mix and the mix the plan was made for, and (when
serving for a target rate) the observed rate against what the running replicas sustain at the
observed mix (`plan_capacity`).
When one of them stays past its threshold for `sustain_s`, and no re-plan happened in the last
`cooldown_s`, it plans again at the observed mix and deploys the new plan only if it is predicted
better by `margin`; the runtime applies it without losing a request (new cells first, then the old
ones drained). Rates are compared in the spec's units: `speedup` converts (an emulated model's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prismserve.control.periodic import Periodic
from prismserve.control.runtime_control import RuntimeControl
from prismserve.planner import (
    Plan,
    PlannerError,
    PlanSpec,
    plan_capacity,
    plan_for_budget,
    plan_for_target,
    spec_at_mix,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplanEvent:
    """One re-plan: when (the watcher's clock), why, the mix and rate it planned for, and the capacity
    (spec units, req/s at that mix) and GPUs before and after."""

    at: float
    wall_time: float
    reason: str
    shares: dict[str, float]
    rate: float
    capacity_before: float
    capacity_after: float
    gpus_before: int
    gpus_after: int
    plan: Plan


@dataclass
class ReplanStatus:
    """What the gateway's metrics show of a watcher: observed rate and mix (served req/s), the capacity
    of the deployed plan at that mix (served req/s, as of the last check), the mix drift, the re-plans."""

    rate: float
    shares: dict[str, float]
    capacity: float | None
    drift: float | None
    replans: int
    last_replan_wall_time: float | None


class Replanner(Periodic):
    """Watches one app's traffic and re-plans it when the mix or the load drifts from its plan.

    `spec` is the plan spec of the app's model at the mix `plan` was made for (options named as
    in `plan`); exactly one of `gpus`
    (re-plan for the most throughput on that many GPUs, `plan_for_budget`) and `target` (the rate
    the deployed plan was made for; re-plans size the plan for the observed rate × `headroom`,
    `plan_for_target`). `plan` is the planner plan deployed now (default: the plan for `spec`, which
    `deploy()` applies); `plan_to_deployment` turns a planner plan into the runtime's plan
    (identity by default; an emulated model needs `EmulatedModel.deployment_plan(plan, speedup)`).

    Feed it with `observe(request_type)` (the gateway does for the app's requests once it is
    `Controls.watch`ed) and run `start()` in the serving event loop, or call `check()` yourself.
    """

    def __init__(
        self,
        runtime: RuntimeControl,
        app_name: str,
        spec: PlanSpec,
        *,
        gpus: int | None = None,
        target: float | None = None,
        plan: Plan | None = None,
        plan_to_deployment: Callable[[Plan], Plan] | None = None,
        speedup: float = 1.0,
        max_exponent: int | None = None,
        window_s: float = 60.0,
        interval_s: float = 5.0,
        min_requests: int = 200,
        mix_threshold: float = 0.15,
        high_water: float = 0.9,
        low_water: float = 0.4,
        headroom: float = 1.25,
        sustain_s: float = 30.0,
        cooldown_s: float = 300.0,
        margin: float = 0.05,
        min_share: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Thresholds, and why these defaults:

        - `window_s` (60 s): the rate and mix are counted over the last minute — long enough that a
          few hundred requests make the mix's shares good to a few percent, short enough to follow a
          shift within minutes. `min_requests` (200): fewer in the window decide nothing — the
          sampling noise of a mix of 8 types is itself about 0.15 at 50 requests, 0.07 at 200.
        - `mix_threshold` (0.15): total variation distance between the observed mix and the plan's;
          0.15 is well above the sampling noise of the window (±0.05 at a few hundred requests).
        - `high_water` (0.9, target mode): load above 90 % of the deployed plan's capacity at the
          observed mix is close to saturation (queues grow without bound at 100 %). `low_water`
          (0.4, target mode): below 40 % the deployment holds more than twice the GPUs it needs.
          On a budget only the mix triggers: the plan is the best for its mix whatever the load, and
          re-planning a saturated deployment for a few percent (a window's mix differs a little from
          the plan's) drained cells under that load (Figure 6a at 1.25x its capacity lost requests).
        - `headroom` (1.25, target mode): plans are sized for 125 % of the observed rate, so that a
          new plan does not sit at its own high-water mark at once.
        - `sustain_s` (30 s): a condition must hold this long (checked every `interval_s`, 5 s) — a
          burst or a blip does not move cells. `cooldown_s` (300 s): after a re-plan (or a re-plan
          found not worth it) nothing happens for five minutes; moving cells costs replica starts.
        - `margin` (0.05): a new plan is deployed only if it is predicted at least 5 % better (more
          capacity at the observed mix; in target mode also fewer GPUs), so that a plan equal up to
          solver noise does not replace the running one.
        - `min_share` (0.01): a request type not seen in the window still gets 1 % of the mix, so the
          new plan keeps a route for it.
        """
        if (gpus is None) == (target is None):
            raise ValueError("give the Replanner exactly one of `gpus` (a fixed budget) and `target` (req/s)")
        if not 0 < low_water < high_water:
            raise ValueError(f"need 0 < low_water < high_water, got {low_water} and {high_water}")
        if window_s <= 0 or interval_s <= 0 or speedup <= 0:
            raise ValueError("window_s, interval_s and speedup must be > 0")
        self.runtime = runtime
        self.app_name = app_name
        self.spec = spec
        self.gpus = gpus
        self.target = target
        self.speedup = speedup
        self.max_exponent = max_exponent
        self.plan_to_deployment = plan_to_deployment or (lambda plan: plan)
        self.window_s = window_s
        self.interval_s = interval_s
        self.min_requests = min_requests
        self.mix_threshold = mix_threshold
        self.high_water = high_water
        self.low_water = low_water
        self.headroom = headroom
        self.sustain_s = sustain_s
        self.cooldown_s = cooldown_s
        self.margin = margin
        self.min_share = min_share
        self.clock = clock
        self.types = [t.name for t in spec.request_types]
        self.shares = {t.name: t.share for t in spec.request_types}  # the mix `plan` was made for
        self.plan = plan if plan is not None else self._plan(spec, target)
        self.history: deque[ReplanEvent] = deque(maxlen=100)  # the latest re-plans
        self.replans = 0  # re-plans deployed in all
        self.observed = 0  # requests observed in all
        self._events: deque[tuple[float, str]] = deque()  # (arrival, type) in the window
        self._counts: dict[str, int] = {}
        self._first: float | None = None
        self._since: float | None = None  # when the current trigger started to hold
        self._quiet_until = float("-inf")
        self._capacity: float | None = None  # of `plan` at the mix of the last check, spec units
        self._drift: float | None = None
        self.what = f"re-planning {app_name}"  # a failed re-plan leaves the plan deployed

    # --- estimates -------------------------------------------------------------------------------

    def observe(self, request_type: str, now: float | None = None) -> None:
        """Count one request of `request_type` arriving at `now` (the watcher's clock)."""
        now = self.clock() if now is None else now
        self._events.append((now, request_type))
        self._counts[request_type] = self._counts.get(request_type, 0) + 1
        self.observed += 1
        if self._first is None:
            self._first = now
        self._evict(now)

    def _evict(self, now: float) -> None:
        events, counts, horizon = self._events, self._counts, now - self.window_s
        while events and events[0][0] < horizon:
            _, kind = events.popleft()
            counts[kind] -= 1

    def rate(self, now: float | None = None) -> float:
        """Requests/s arriving over the window (served units)."""
        now = self.clock() if now is None else now
        self._evict(now)
        if self._first is None:
            return 0.0
        span = min(self.window_s, now - self._first)
        return len(self._events) / span if span > 0 else 0.0

    def mix(self, now: float | None = None) -> dict[str, float]:
        """The observed share of each of the spec's request types over the window (unknown types
        left out), each at least `min_share`; empty while the window holds none of them."""
        now = self.clock() if now is None else now
        self._evict(now)
        counts = {t: self._counts.get(t, 0) for t in self.types}
        total = sum(counts.values())
        if not total:
            return {}
        raw = {t: max(n / total, self.min_share) for t, n in counts.items()}
        norm = sum(raw.values())
        return {t: share / norm for t, share in raw.items()}

    def status(self, now: float | None = None) -> ReplanStatus:
        """The watcher's state for the metrics."""
        last = self.history[-1] if self.history else None
        return ReplanStatus(
            rate=self.rate(now),
            shares=self.mix(now),
            capacity=None if self._capacity is None else self._capacity * self.speedup,
            drift=self._drift,
            replans=self.replans,
            last_replan_wall_time=last.wall_time if last else None,
        )

    # --- decisions -------------------------------------------------------------------------------

    async def check(self, now: float | None = None) -> ReplanEvent | None:
        """Compare the observed traffic with the deployed plan; re-plan and deploy when a drift has
        held for `sustain_s` outside a cool-down and the new plan is better by `margin`."""
        now = self.clock() if now is None else now
        self._evict(now)
        shares = self.mix(now)
        if len(self._events) < self.min_requests or not shares:
            self._since = None
            return None
        rate = self.rate(now) / self.speedup
        # An LP and a model build: milliseconds, but off the serving loop.
        observed, capacity = await asyncio.to_thread(self._at_mix, shares)
        self._capacity = capacity
        self._drift = drift = total_variation(shares, self.shares)
        reason = self._trigger(drift, rate, capacity)
        if reason is None:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        if now - self._since < self.sustain_s or now < self._quiet_until:
            return None
        self._since = None
        self._quiet_until = now + self.cooldown_s  # planning is not free, whatever comes of it
        try:
            new = await asyncio.to_thread(self._plan, observed, rate * self.headroom)
        except PlannerError as exc:
            log.warning("re-planning %s (%s) found no plan: %s", self.app_name, reason, exc)
            return None
        after = await asyncio.to_thread(plan_capacity, observed, new)
        worse = self._not_better(rate, capacity, after, new)
        if worse is not None:
            log.info("re-planning %s (%s): kept the plan deployed, %s", self.app_name, reason, worse)
            return None
        event = ReplanEvent(
            at=now,
            wall_time=time.time(),
            reason=reason,
            shares=shares,
            rate=rate,
            capacity_before=capacity,
            capacity_after=after,
            gpus_before=self.plan.total_gpus,
            gpus_after=new.total_gpus,
            plan=new,
        )
        await self.runtime.deploy(self.app_name, self.plan_to_deployment(new))
        self.plan, self.shares, self._capacity, self._drift = new, shares, after, 0.0
        self.history.append(event)
        self.replans += 1
        log.warning(
            "re-planned %s: %s; mix %s at %.3g req/s; capacity %.3g -> %.3g req/s on %d -> %d GPUs",
            self.app_name,
            reason,
            {t: round(s, 3) for t, s in shares.items()},
            rate * self.speedup,
            capacity * self.speedup,
            after * self.speedup,
            event.gpus_before,
            event.gpus_after,
        )
        return event

    def _at_mix(self, shares: dict[str, float]) -> tuple[PlanSpec, float]:
        """The spec at `shares`, and the deployed plan's capacity there."""
        observed = spec_at_mix(self.spec, shares)
        return observed, plan_capacity(observed, self.plan)

    def _trigger(self, drift: float, rate: float, capacity: float) -> str | None:
        """Why the deployed plan no longer fits the traffic, or None."""
        if drift > self.mix_threshold:
            return f"mix drifted by {drift:.2f} (> {self.mix_threshold:g})"
        if self.target is None:
            # On a fixed budget the plan deployed is the planner's best for its mix: more load than it
            # sustains is no reason to change it, and a change (cells drained under that load) costs.
            return None
        if rate > self.high_water * capacity:
            return f"load {rate * self.speedup:.3g} req/s above {self.high_water:.0%} of capacity {capacity * self.speedup:.3g}"
        if rate < self.low_water * capacity:
            return f"load {rate * self.speedup:.3g} req/s below {self.low_water:.0%} of capacity {capacity * self.speedup:.3g}"
        return None

    def _not_better(self, rate: float, before: float, after: float, new: Plan) -> str | None:
        """Why `new` is not worth deploying, or None: with a budget, it must sustain `margin` more
        at the observed mix; for a target, it must cover the needed rate where the deployed plan does
        not (with `margin` more), or cover it on `margin` fewer GPUs."""
        if self.target is None or before < rate * self.headroom:
            if after >= before * (1 + self.margin):
                return None
            return f"the new plan's {after:.3g} req/s is not {self.margin:.0%} above {before:.3g}"
        if new.total_gpus <= self.plan.total_gpus * (1 - self.margin):
            return None
        return f"the new plan's {new.total_gpus} GPUs are not {self.margin:.0%} fewer than {self.plan.total_gpus}"

    def _plan(self, spec: PlanSpec, rate: float | None) -> Plan:
        if self.gpus is not None:
            return plan_for_budget(spec, self.gpus, self.max_exponent)
        assert rate is not None  # target mode: a rate to plan for
        return plan_for_target(spec, rate, self.max_exponent)

    # --- running -------------------------------------------------------------------------------

    async def deploy(self) -> None:
        """Deploy the plan the watcher holds as current (the plan for `spec` unless one was given)."""
        await self.runtime.deploy(self.app_name, self.plan_to_deployment(self.plan))


def total_variation(observed: Mapping[str, float], planned: Mapping[str, float]) -> float:
    """Half the L1 distance between two mixes: the share of requests that would have to change type."""
    types = set(observed) | set(planned)
    return 0.5 * sum(abs(observed.get(t, 0.0) - planned.get(t, 0.0)) for t in types)
