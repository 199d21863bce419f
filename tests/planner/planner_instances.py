"""Random small planner instances and brute-force references the planner's tests compare against."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import highspy

from prismserve.planner import Cell, Solution, build_model, parse_spec

COMPONENTS = ["A", "B", "C", "D"]


def random_spec_data(rng: random.Random, explicit_paths: bool = False) -> dict:
    """2–4 components, 2–6 options (a singleton for every component, some colocated), 1–3 types."""
    components = COMPONENTS[: rng.randint(2, 4)]
    options = [
        {
            "name": c,
            "components": [c],
            "gpus": rng.choice([1, 1, 1, 2]),
            "throughput": round(rng.uniform(0.5, 8), 2),
        }
        for c in components
    ]
    if len(options) < 6 and rng.random() < 0.25:
        c = rng.choice(components)  # a second option for one component, e.g. tensor-parallel on 2 GPUs
        options.append(
            {"name": f"{c}2", "components": [c], "gpus": 2, "throughput": round(rng.uniform(0.5, 12), 2)}
        )
    combos = [
        list(combo)
        for size in range(2, len(components) + 1)
        for combo in itertools.combinations(components, size)
    ]
    rng.shuffle(combos)
    for combo in combos[: rng.randint(0, 6 - len(options))]:
        options.append(
            {
                "name": "".join(combo),
                "components": combo,
                "gpus": rng.choice([1, 1, 2]),
                "throughput": round(rng.uniform(0.3, 5), 2),
            }
        )
    types = []
    for i in range(rng.randint(1, 3)):
        picked = sorted(rng.sample(components, rng.randint(1, len(components))), key=components.index)
        types.append({"name": f"t{i}", "components": picked})
    weights = [rng.uniform(0.1, 1) for _ in types]
    for t, w in zip(types, weights, strict=True):
        t["share"] = w / sum(weights)
    types[-1]["share"] = 1 - sum(t["share"] for t in types[:-1])
    data = {"components": components, "options": options, "request_types": types}
    if explicit_paths:
        spec = parse_spec(data)
        model = build_model(spec)
        for t in types:
            paths = [list(p.options) for p in model.paths[t["name"]]]
            t["paths"] = rng.sample(paths, rng.randint(1, len(paths)))
    return data


def random_spec(rng: random.Random, explicit_paths: bool = False):
    """A parsed random spec."""
    return parse_spec(random_spec_data(rng, explicit_paths))


class FixedReplicasLP:
    """Appendix B's path formulation with replicas fixed: max R, one LP re-solved per replica vector.

    This uses a rate per whole path (`model.paths`, `model.work`), not the planner's hop flows, so
    it checks the planner's formulation as well as its solver.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.options = [e.name for e in model.spec.options]
        self.pairs = [(t, p) for t, paths in model.paths.items() for p in range(len(paths))]
        h = self.h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        n = len(self.pairs) + 1
        h.addVars(n, [0.0] * n, [highspy.kHighsInf] * n)
        for s in self.options:
            cols = [j for j, (t, p) in enumerate(self.pairs) if model.work.get((s, t, p))]
            vals = [model.work[(s, *self.pairs[j])] for j in cols]
            h.addRow(-highspy.kHighsInf, 0.0, len(cols), cols, vals)
        for request_type in model.spec.request_types:
            cols = [j for j, (t, _) in enumerate(self.pairs) if t == request_type.name] + [n - 1]
            vals = [1.0] * (len(cols) - 1) + [-request_type.share]
            h.addRow(0.0, 0.0, len(cols), cols, vals)
        h.changeColsCost(1, [n - 1], [1.0])
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)

    def max_rate(self, replicas: tuple[int, ...]) -> float:
        """The most req/s these replicas sustain."""
        for i, r in enumerate(replicas):
            self.h.changeRowBounds(i, -highspy.kHighsInf, float(r))
        self.h.run()
        return self.h.getInfo().objective_function_value


def replica_vectors(gpus: list[int], budget: int) -> Iterator[tuple[int, ...]]:
    """Every replica vector whose GPUs fit in the budget."""
    if not gpus:
        yield ()
        return
    for r in range(budget // gpus[0] + 1):
        for rest in replica_vectors(gpus[1:], budget - r * gpus[0]):
            yield (r, *rest)


def exhaustive(model, budget: int) -> list[tuple[int, float]]:
    """(GPUs used, max req/s) of every replica vector within the budget."""
    lp = FixedReplicasLP(model)
    gpus = [model.spec.option(s).gpus for s in lp.options]
    return [
        (sum(g * r for g, r in zip(gpus, v, strict=True)), lp.max_rate(v))
        for v in replica_vectors(gpus, budget)
    ]


def cells_from(pairs: list[tuple[int, float]]) -> list[Cell]:
    """Cells with the given (GPUs, req/s) and no deployment inside (for mixture tests)."""
    return [Cell(g, Solution(r, {}, {}, g)) for g, r in pairs]


def random_cells(rng: random.Random) -> list[Cell]:
    """Efficient power-of-two cells: per-GPU throughput strictly grows with size, some sizes dropped."""
    cells, per_gpu = [], rng.uniform(0.5, 2)
    for exponent in range(rng.randint(0, 2), rng.randint(3, 6)):
        if cells and rng.random() < 0.3:
            continue  # a dropped size
        per_gpu *= rng.uniform(1.01, 1.5)
        cells.append((2**exponent, round(per_gpu * 2**exponent, 3)))
    return cells_from(cells)
