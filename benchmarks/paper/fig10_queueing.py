"""Figure 10's deployments as a discrete-event queueing model: the run-length and batch-fill study.

The same plans, requests, overload (arrivals at `--load` x the plan's prediction) and measurement
(completions between the first and last 10 %) as fig10_internvl3.py, but the `sim` replicas are
simulated in virtual time: static batches (`AsyncBatcher`) or processor sharing (`SharedEngine`) with
each option's profile, replicas picked by fewest invocations in flight (the dispatcher's static
policy), a path per request by the plan's probabilities. Seconds per run instead of minutes, and
no CPU noise, so it separates what the queueing does from what the machine does, at any run
length. Per option it reports busy time and batch fill inside the measured window.

`--iid` draws each request's path independently (the runtime before `planned_choice`), `--fifo`
serves every replica in arrival order (before the sim served later hops first).
Run: python benchmarks/paper/fig10_queueing.py [--requests 400 1000 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
from collections.abc import Callable
from pathlib import Path

from fig10_internvl3 import GPUS, TABLE3
from harness import RESULTS, plan_for, retime, write

from prismserve.bench.workloads import RequestSpec, controlled
from prismserve.emulate.catalog import INTERNVL3, INTERNVL3_BASELINES
from prismserve.emulate.model import EmulatedModel
from prismserve.executors.sim import SimProfile
from prismserve.planner import Plan


class Clock:
    """Virtual time and its events."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def run(self) -> None:
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action()


class Replica:
    """One `sim` replica: whole batches one after another, or processor sharing (continuous)."""

    def __init__(self, clock: Clock, profile: SimProfile, fifo: bool) -> None:
        self.clock, self.profile, self.fifo = clock, profile, fifo
        self.in_flight = 0  # the dispatcher's lease count: waiting or being served
        self.waiting: list[tuple[float, int, Callable[[], None]]] = []  # (work, priority, done)
        self.running: dict[int, list] = {}  # continuous: id -> [seconds left, done]
        self.batch_busy = False
        self.last = 0.0
        self.wake_token: object = None
        self.ids = itertools.count()
        self.log: list[tuple[float, float, int]] = []  # (start, end, requests served at once)

    def submit(self, work: float, priority: int, done: Callable[[], None]) -> None:
        self.in_flight += 1
        at = len(self.waiting)
        while not self.fifo and at > 0 and self.waiting[at - 1][1] < priority:
            at -= 1
        self.waiting.insert(at, (work, priority, done))
        if self.profile.continuous:
            self._share()
        elif not self.batch_busy:
            self._next_batch()

    def _next_batch(self) -> None:
        if not self.waiting:
            self.batch_busy = False
            return
        batch, self.waiting = self.waiting[: self.profile.max_batch], self.waiting[self.profile.max_batch :]
        seconds = self.profile.batch_time(len(batch), sum(w for w, _, _ in batch) / len(batch))
        self.batch_busy = True
        self.log.append((self.clock.now, self.clock.now + seconds, len(batch)))

        def finish() -> None:
            for _, _, done in batch:
                self.in_flight -= 1
                done()
            self._next_batch()

        self.clock.at(self.clock.now + seconds, finish)

    def _rate(self) -> float:
        return 1 / (1 + self.profile.batch_growth * (len(self.running) - 1))

    def _share(self) -> None:
        now = self.clock.now
        if self.running:
            self.log.append((self.last, now, len(self.running)))
            advanced = (now - self.last) * self._rate()
            for key in list(self.running):
                self.running[key][0] -= advanced
                if self.running[key][0] <= 1e-9:
                    _, done = self.running.pop(key)
                    self.in_flight -= 1
                    done()
        self.last = now
        while self.waiting and len(self.running) < self.profile.max_batch:
            work, _, done = self.waiting.pop(0)
            self.running[next(self.ids)] = [self.profile.latency_s * work, done]
        if self.running:
            token = self.wake_token = object()
            until = min(left for left, _ in self.running.values()) / self._rate()
            self.clock.at(now + until, lambda: self._share() if self.wake_token is token else None)


def simulate(
    model: EmulatedModel, plan: Plan, specs: list[RequestSpec], seed: int, iid: bool, fifo: bool
) -> dict:
    """One overloaded run of `plan` on `specs`: the steady completion rate (A100 scale) and, per
    option, busy fraction and mean batch inside the measured window."""
    clock, rng = Clock(), random.Random(seed)
    replicas: dict[str, list[Replica]] = {}
    for cell in plan.cells:
        for name, n in cell.replicas.items():
            replicas.setdefault(name, []).extend(
                Replica(clock, model.option(name).profile(1.0), fifo) for _ in range(n * cell.count)
            )
    turn = dict.fromkeys(replicas, 0)

    def pick(name: str) -> Replica:  # TaskManager._pick_static
        pool, best = replicas[name], None
        for step in range(len(pool)):
            replica = pool[(turn[name] + step) % len(pool)]
            if best is None or replica.in_flight < best.in_flight:
                best = replica
        turn[name] += 1
        assert best is not None
        return best

    credits: dict[str, list[float]] = {}
    ends: list[float] = []
    for spec in specs:
        needs, work = model.costs.needs(spec), model.costs.work(spec)
        paths = model.paths(needs)
        names = sorted(paths)
        weights = [plan.routing.get(spec.request_type, {}).get(n, 0.0) for n in names]
        if iid:
            index = rng.choices(range(len(names)), weights)[0]
        else:  # planned_choice: smooth weighted round-robin
            credit = credits.setdefault(spec.request_type, [0.0] * len(names))
            for i, weight in enumerate(weights):
                credit[i] += weight
            index = max((i for i, w in enumerate(weights) if w > 0), key=credit.__getitem__)
            credit[index] -= sum(weights)
        hops = [(name, model.option(name).seconds(work, role)) for name, role in paths[names[index]]]

        def step(hops: list[tuple[str, float]], i: int) -> None:
            if i == len(hops):
                ends.append(clock.now)
                return
            name, seconds = hops[i]
            pick(name).submit(seconds, i, lambda: step(hops, i + 1))

        clock.at(spec.arrival_s, lambda hops=hops: step(hops, 0))
    clock.run()
    ends.sort()
    edge = max(len(ends) // 10, 1)
    start, stop = ends[edge], ends[-1 - edge]
    stages = {}
    for name, pool in replicas.items():
        busy = served = 0.0
        for replica in pool:
            for a, b, n in replica.log:
                overlap = max(0.0, min(b, stop) - max(a, start))
                busy += overlap
                served += overlap * n
        profile = model.option(name).profile(1.0)
        stages[name] = {
            "replicas": len(pool),
            "busy": busy / len(pool) / (stop - start),
            "mean_batch": served / busy if busy else 0.0,
            "max_batch": profile.max_batch,
        }
    return {"steady_rps": (len(ends) - 1 - 2 * edge) / (stop - start), "stages": stages}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, nargs="+", default=[400, 1000, 2000])
    parser.add_argument("--repeats", type=int, default=3, help="runs per plan (path draws with --iid)")
    parser.add_argument("--load", type=float, default=1.25)
    parser.add_argument("--workloads", nargs="+", choices=list(TABLE3), default=list(TABLE3))
    parser.add_argument("--iid", action="store_true", help="independent path draws per request")
    parser.add_argument("--fifo", action="store_true", help="replicas serve in arrival order only")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    model = INTERNVL3
    out: dict = {"iid": args.iid, "fifo": args.fifo, "load": args.load, "runs": {}}
    print(
        f"{'requests':>8} {'workload':<17}"
        + "".join(f"{label:>12}" for label in [*INTERNVL3_BASELINES, "prismserve"])
        + "  plan/best"
    )
    for count in args.requests:
        for name in args.workloads:
            resolution, images, text_in, text_out = TABLE3[name]
            requests = controlled(1.0, resolution, images, text_in, text_out, count=count, seed=0)
            spec = model.planner_spec(requests)
            plans = {
                label: plan_for(model.restricted(spec, options), GPUS)
                for label, options in INTERNVL3_BASELINES.items()
            }
            plans["prismserve"] = plan_for(spec, GPUS)
            specs = retime(requests, args.load * plans["prismserve"].throughput)
            row = {}
            for label, plan in plans.items():
                runs = [
                    simulate(model, plan, specs, seed, args.iid, args.fifo) for seed in range(args.repeats)
                ]
                measured = statistics.mean(r["steady_rps"] for r in runs)
                row[label] = {
                    "predicted_rps": plan.throughput,
                    "measured_rps": measured,
                    "accuracy": measured / plan.throughput,
                    "stages": runs[0]["stages"],
                }
            best = max(r["measured_rps"] for label, r in row.items() if label != "prismserve")
            out["runs"][f"{count} {name}"] = row
            print(
                f"{count:>8} {name:<17}"
                + "".join(f"{r['accuracy']:>12.3f}" for r in row.values())
                + f"  {row['prismserve']['measured_rps'] / best:.3f}",
                flush=True,
            )
    suffix = "".join(f"_{flag}" for flag in ("iid", "fifo") if getattr(args, flag))
    print("(measured / predicted per deployment; plan/best: the planner's plan over the best baseline)")
    print("wrote", write(f"fig10_queueing{suffix}", out, args.results))


if __name__ == "__main__":
    main()
