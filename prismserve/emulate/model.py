"""Emulated models: a cost model, its deployment options and their batching behaviour.

From one `EmulatedModel` come the planner's spec (each option's throughput at a workload's mix,
000 Algorithm 3's input), the `sim` profiles of its deployments, and the runtime plan for a planner
result, so that the planner, the runtime and the emulation agree on what every option is.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, InstanceOf

from prismserve.bench.workloads import RequestSpec
from prismserve.emulate.costs import GPU_MEMORY_GB, CostModel
from prismserve.executors.sim import SimProfile
from prismserve.planner import CellPlan, DeploymentOption, Plan, PlanSpec, RequestType
from prismserve.planner.paths import entry_role, entry_roles

DEPLOYMENT_PREFIX = "model.executors."  # the app's unit-task paths: `model.executors.<option>` (EmulatedTask)


class EmulatedOption(BaseModel):
    """A deployment option: the components a replica runs, its GPUs, speed and batching.

    `speed`: the replica's speed relative to one A100 (tensor parallelism over 2 GPUs: 1.8).
    `max_batch` and `batch_gain` (full-batch throughput over batch-1 throughput) shape latency at
    low load; at full batch a replica serves one request per `mean work / speed` seconds.
    `continuous`: continuous batching (requests join and leave a running batch, as in vLLM)
    instead of whole batches one after another.
    `factors[c]` multiplies component c's work here (colocation: a smaller KV cache, batching lost).
    `separable`: a request may visit the replica once per block of its components (TriInfer's ED:
    encode, then decode after a prefill elsewhere; the planner's `DeploymentOption.separable`).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    components: tuple[str, ...]
    gpus: int = 1
    speed: float = 1.0
    max_batch: int = 1
    batch_gain: float = 1.0
    continuous: bool = False
    factors: dict[str, float] = Field(default_factory=dict)
    payload_bytes: int = 256 << 10
    separable: bool = False

    def seconds(self, work: dict[str, float], role: Iterable[str]) -> float:
        """A100-seconds of this replica's time for `role`'s components of a request with `work`."""
        return sum(work.get(c, 0.0) * self.factors.get(c, 1.0) for c in role) / self.speed

    def profile(self, speedup: float) -> SimProfile:
        """The `sim` profile: batch-1 takes `batch_gain` × its work, a full batch `max_batch` × the mean work."""
        growth = (self.max_batch / self.batch_gain - 1) / (self.max_batch - 1) if self.max_batch > 1 else 0.0
        return SimProfile(
            latency_s=self.batch_gain / speedup,
            batch_growth=growth,
            max_batch=self.max_batch,
            payload_bytes=self.payload_bytes,
            continuous=self.continuous,
        )


class EmulatedModel(BaseModel):
    """A model family to emulate: its cost model and deployment options."""

    model_config = ConfigDict(frozen=True)

    name: str
    costs: InstanceOf[CostModel]
    options: tuple[EmulatedOption, ...]

    @property
    def components(self) -> tuple[str, ...]:
        return self.costs.components

    def option(self, name: str) -> EmulatedOption:
        """The option called `name`."""
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(
            f"model {self.name!r} has no option {name!r} (it has {[e.name for e in self.options]})"
        )

    def paths(
        self, needs: tuple[str, ...], allowed: Iterable[str] | None = None
    ) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
        """Valid paths for a request needing `needs` (model order): name -> [(option, role)].

        Each option runs every component it holds that is still to run; that role must be the next
        components in order (papers/NOTES.md, Appendix B), so the path covers `needs` exactly once.
        A separable option runs the next block it holds, and may be visited again (`entry_role`).
        """
        options = [e for e in self.options if allowed is None or e.name in set(allowed)]
        found: dict[str, list[tuple[str, tuple[str, ...]]]] = {}

        def walk(done: int, hops: list[tuple[str, tuple[str, ...]]]) -> None:
            if done == len(needs):
                found["->".join(name for name, _ in hops)] = list(hops)
                return
            for option in options:
                if role := entry_role(needs, done, option.components, option.separable):
                    walk(done + len(role), [*hops, (option.name, role)])

        walk(0, [])
        return found

    def memory_gb(self, option: EmulatedOption, workload: list[RequestSpec]) -> float:
        """GB per GPU a replica of `option` needs for `workload` (the cost model's `memory_gb`, at the
        option's batch and the workload's longest context per component)."""
        longest: dict[str, int] = {}
        for spec in workload:
            for c, tokens in self.costs.context_tokens(spec).items():
                longest[c] = max(longest.get(c, 0), tokens)
        return self.costs.memory_gb(option.components, option.gpus, option.max_batch, longest)

    def out_of_memory(self, workload: list[RequestSpec]) -> dict[str, str]:
        """Options whose replicas do not fit a GPU for `workload`: name -> why (the OOM a run reports)."""
        if not self.costs.WEIGHTS_GB:
            return {}
        found = {}
        for option in self.options:
            need = self.memory_gb(option, workload)
            if need > GPU_MEMORY_GB:
                found[option.name] = (
                    f"out of memory: needs {need:.1f} GB per GPU of {GPU_MEMORY_GB:.0f} "
                    f"({option.gpus} GPU(s), batch {option.max_batch} at the workload's longest context)"
                )
        return found

    def planner_spec(self, workload: list[RequestSpec], options: Iterable[str] | None = None) -> PlanSpec:
        """The plan spec at `workload`'s mix: each option's throughput is what its `sim` replica sustains.

        A replica serving the mix spends `seconds(work, Comp(s) ∩ needs)` per request; its throughput
        (requests of the mix per second) is the inverse of the mean — what a profiler would measure
        on this workload if every batch were full. The analytic spec, for callers that want the
        emulation's exact costs; the server measures its replicas instead (`profile/shaped.py`).
        Options that run out of memory on it (`out_of_memory`) are left out.
        """
        oom = self.out_of_memory(workload)  # a replica that cannot start is no option
        chosen = [
            e for e in self.options if (options is None or e.name in set(options)) and e.name not in oom
        ]
        shares: dict[str, tuple[tuple[str, ...], int]] = {}
        busy = {e.name: 0.0 for e in chosen}
        # Replica seconds per role and type, as a profiler would measure them (000 Algorithm 3
        # estimates them from one colocation factor per option, which the emulation does not obey).
        roles: dict[str, dict[str, dict[str, float]]] = {e.name: {} for e in chosen}
        for spec in workload:
            needs = self.costs.needs(spec)
            work = self.costs.work(spec)
            count = shares.get(spec.request_type, (needs, 0))[1]
            shares[spec.request_type] = (needs, count + 1)
            for option in chosen:
                busy[option.name] += option.seconds(work, [c for c in needs if c in option.components])
                mine = roles[option.name].setdefault(spec.request_type, {})
                for role in entry_roles(needs, option.components, option.separable):
                    key = "+".join(role)
                    mine[key] = mine.get(key, 0.0) + option.seconds(work, role)
        return PlanSpec(
            components=list(self.components),
            options=[
                DeploymentOption(
                    name=e.name,
                    components=list(e.components),
                    gpus=e.gpus,
                    throughput=len(workload) / busy[e.name],
                    separable=e.separable,
                    role_seconds={
                        t: {role: total / shares[t][1] for role, total in by_role.items()}
                        for t, by_role in roles[e.name].items()
                        if by_role
                    },
                )
                for e in chosen
                if busy[e.name] > 0
            ],
            request_types=[
                RequestType(name=name, components=list(needs), share=count / len(workload))
                for name, (needs, count) in sorted(shares.items())
            ],
            stages=self.costs.stage_costs(),
        )

    def served_spec(self, workload: list[RequestSpec], speedup: float) -> PlanSpec:
        """`planner_spec` at the speed the `sim` replicas run with (times divided by `speedup`), in
        the server's units (requests/s as served): the replicas' exact full-batch costs."""
        spec = self.planner_spec(workload)
        return spec.model_copy(
            update={
                "options": [
                    e.model_copy(
                        update={
                            "throughput": e.throughput * speedup,
                            "role_seconds": {
                                t: {role: s / speedup for role, s in roles.items()}
                                for t, roles in e.role_seconds.items()
                            },
                        }
                    )
                    for e in spec.options
                ]
            }
        )

    def served_deployment(self, plan: Plan, speedup: float) -> Plan:
        """The runtime plan for a plan of `served_spec` (its rates already in served units)."""
        return self.deployment_plan(_rates_scaled(plan, 1 / speedup), speedup)

    def planner_plan(self, deployed: Plan, speedup: float) -> Plan:
        """A deployed plan (`served_deployment`) back in the planner's terms: option names, A100-scale rates."""
        cells = [
            cell.model_copy(
                update={"replicas": {n.removeprefix(DEPLOYMENT_PREFIX): r for n, r in cell.replicas.items()}}
            )
            for cell in deployed.cells
        ]
        plan = deployed.model_copy(update={"cells": cells, "profiles": {}})
        return _rates_scaled(plan, 1 / speedup)

    def capacity(
        self, replicas: dict[str, int], routing: dict[str, dict[str, float]], workload: list[RequestSpec]
    ) -> float:
        """Requests/s a deployment sustains on `workload`, from the emulation's own costs (no Algorithm 3).

        Each option's load is the mean replica time a request puts on it over the routed paths;
        the deployment saturates when the most loaded option's replicas are all busy. This is
        what the `sim` replicas will do, so it separates the planner's estimate from the runtime's
        delivery.
        """
        load = dict.fromkeys(replicas, 0.0)
        for spec in workload:
            needs = self.costs.needs(spec)
            work = self.costs.work(spec)
            paths = self.paths(needs)
            for name, p in routing.get(spec.request_type, {}).items():
                for o, role in paths[name]:
                    load[o] = load.get(o, 0.0) + p * self.option(o).seconds(work, role)
        busy = [load[s] / len(workload) / n for s, n in replicas.items() if n and load.get(s)]
        unserved = [s for s, seconds in load.items() if seconds and not replicas.get(s)]
        return 0.0 if unserved or not busy else 1.0 / max(busy)

    def restricted(self, spec: PlanSpec, allowed: Iterable[str]) -> PlanSpec:
        """`spec` with every request type limited to paths through `allowed` options (a baseline
        deployment such as Monolith or E/PD); the planner then picks only their replica counts."""
        allowed = set(allowed) & {option.name for option in spec.options}  # out-of-memory ones are not in it
        types = []
        for request_type in spec.request_types:
            paths = self.paths(tuple(request_type.components), allowed)
            if not paths:
                raise ValueError(f"options {sorted(allowed)} cannot serve request type {request_type.name!r}")
            types.append(request_type.model_copy(update={"paths": [name.split("->") for name in paths]}))
        return spec.model_copy(update={"request_types": types})

    def deployment_plan(self, plan: Plan, speedup: float) -> Plan:
        """The plan to deploy for a planner result: its cells and routing named after the app's
        deployments, every option's sim profile, and the throughput at `speedup`."""
        return Plan(
            cells=[
                CellPlan(
                    gpus=cell.gpus,
                    count=cell.count,
                    replicas={DEPLOYMENT_PREFIX + n: r for n, r in cell.replicas.items() if r},
                    throughput=None if cell.throughput is None else cell.throughput * speedup,
                )
                for cell in plan.cells
            ],
            routing=plan.routing,
            profiles={DEPLOYMENT_PREFIX + e.name: e.profile(speedup).model_dump() for e in self.options},
            gpus=plan.gpus,
            throughput=None if plan.throughput is None else plan.throughput * speedup,
        )


def _rates_scaled(plan: Plan, factor: float) -> Plan:
    """`plan` with its predicted rates (the plan's and each cell's) multiplied by `factor`."""

    def scaled(rate: float | None) -> float | None:
        return None if rate is None else rate * factor

    return plan.model_copy(
        update={
            "throughput": scaled(plan.throughput),
            "cells": [cell.model_copy(update={"throughput": scaled(cell.throughput)}) for cell in plan.cells],
        }
    )
