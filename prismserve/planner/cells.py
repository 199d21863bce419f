"""Cells (000 §4.3): the best plan for each power-of-two size, and mixtures of them.

- `plan_cells`: Algorithm 1 — a max-throughput MILP per size 2^0 … 2^cmax; sizes where no
  instance fits are dropped, then sizes that do not beat copies of the last kept cell.
- `mixture_for_target`: the fewest GPUs reaching a target rate. Exact, unlike the paper's greedy
  Algorithm 2 (`greedy_mixture`, kept as a baseline; papers/NOTES.md has a counterexample).
- `mixture_for_budget`: the most throughput for N GPUs, by binary decomposition of N.
- `budget_mixture`: that, or copies of the largest cell plus one cell solved on exactly the
  leftover GPUs when it does better (budgets a power-of-two cell cannot use, e.g. 5–7 GPUs for a
  model whose smallest instance needs 5).
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prismserve.planner.errors import InfeasibleError, SpecError
from prismserve.planner.milp import Solution, check_target, max_throughput
from prismserve.planner.throughput import Model


@dataclass
class Cell:
    """A cell size with its best deployment."""

    gpus: int  # the cell's size: a power of two, except the leftover cell of a budget (`budget_mixture`)
    solution: Solution

    @property
    def throughput(self) -> float:
        """Requests/s one cell sustains."""
        return self.solution.throughput


def plan_cells(model: Model, max_exponent: int = 6) -> list[Cell]:
    """Algorithm 1: efficient cells of sizes 2^0 … 2^max_exponent, smallest first."""
    if not 0 <= max_exponent <= 12:
        raise SpecError(f"the largest cell exponent must be within 0..12, got {max_exponent}")
    sizes = [2**exponent for exponent in range(max_exponent + 1)]
    # HiGHS releases the GIL while it solves: the sizes' MILPs run two at a time, largest (slowest) first.
    with ThreadPoolExecutor(max_workers=2) as pool:
        solutions = list(pool.map(lambda size: max_throughput(model, size), sizes[::-1]))[::-1]
    kept: list[Cell] = []
    for size, solution in zip(sizes, solutions, strict=True):
        if solution.throughput <= 0:
            continue  # no complete instance fits in this size
        if not kept or solution.throughput > (size // kept[-1].gpus) * kept[-1].throughput * (1 + 1e-9):
            kept.append(Cell(size, solution))
    if not kept:
        raise InfeasibleError(
            f"no cell of up to {2**max_exponent} GPUs can serve every request type: an option needs "
            "more GPUs than that, or a request type cannot be served"
        )
    return kept


def mixture_for_target(cells: list[Cell], target: float) -> Counter[int]:
    """Fewest GPUs whose cells reach `target` req/s: cell size -> count (exact).

    Kept cells get more efficient per GPU with size and their sizes divide each other, so some
    optimum is copies of the largest cell plus smaller cells on fewer GPUs than one largest cell
    (any smaller cells filling that many GPUs contain a subset of exactly its size, which one
    largest cell can replace). A knapsack over those few GPU counts finds the best remainder, so
    the time does not grow with the target. Ties go to the mixture with more throughput.
    """
    check_target(target)
    largest = cells[-1]
    best_small = _best_with_smaller(cells[:-1], largest.gpus - 1)
    choice: tuple[int, float, Counter[int]] | None = None
    for gpus, (throughput, mix) in best_small.items():
        copies = ceil_div(target - throughput, largest.throughput) if throughput < target else 0
        total = copies * largest.gpus + gpus
        reached = copies * largest.throughput + throughput
        if choice is None or (total, -reached) < (choice[0], -choice[1]):
            combined = Counter(mix)
            if copies:
                combined[largest.gpus] += copies
            choice = (total, reached, combined)
    assert choice is not None
    return choice[2]


def _best_with_smaller(cells: list[Cell], capacity: int) -> dict[int, tuple[float, Counter[int]]]:
    """For every GPU count 0..capacity, the most throughput smaller cells give within it."""
    best: dict[int, tuple[float, Counter[int]]] = {0: (0.0, Counter())}
    for gpus in range(1, capacity + 1):
        top = best[gpus - 1]
        for cell in cells:
            if cell.gpus <= gpus:
                rest = best[gpus - cell.gpus]
                if rest[0] + cell.throughput > top[0] + 1e-12:
                    top = (rest[0] + cell.throughput, rest[1] + Counter({cell.gpus: 1}))
        best[gpus] = top
    return best


def greedy_mixture(cells: list[Cell], target: float) -> Counter[int]:
    """The paper's Algorithm 2, literally: largest cell not exceeding the remaining rate, else the smallest."""
    mix: Counter[int] = Counter()
    reached = 0.0
    while reached < target - 1e-12:
        fitting = [c for c in cells if c.throughput <= target - reached]
        cell = max(fitting, key=lambda c: c.gpus) if fitting else min(cells, key=lambda c: c.gpus)
        mix[cell.gpus] += 1
        reached += cell.throughput
    return mix


def mixture_for_budget(cells: list[Cell], budget: int) -> Counter[int]:
    """Most throughput within `budget` GPUs, by binary decomposition (000 §4.3).

    Copies of the largest cell take what they can; each remaining power of two goes to the kept
    cell of that size, or to copies of the largest kept cell below it when that size was dropped.
    """
    smallest = cells[0].gpus
    if budget < smallest:
        raise InfeasibleError(
            f"a budget of {budget} GPUs is below the smallest cell ({smallest} GPUs); give at least {smallest}"
        )
    return _binary_decomposition(cells, budget)


def _binary_decomposition(cells: list[Cell], budget: int) -> Counter[int]:
    """`mixture_for_budget` without the check: empty when the budget holds no cell."""
    by_size = {c.gpus: c for c in cells}
    largest = cells[-1].gpus
    mix: Counter[int] = Counter()
    if budget >= largest:
        mix[largest] = budget // largest
    remainder = budget % largest
    bit = largest // 2
    while bit >= 1:
        if remainder & bit:
            fitting = [size for size in by_size if size <= bit]
            if fitting:
                size = max(fitting)
                mix[size] += bit // size
        bit //= 2
    return +mix


def budget_mixture(model: Model, cells: list[Cell], budget: int) -> tuple[list[Cell], Counter[int]]:
    """Most throughput within `budget` GPUs: the binary decomposition, or copies of the largest cell
    plus one cell solved on exactly the leftover GPUs (`budget` mod the largest cell) when that does
    better. Returns the cells (with the leftover cell when taken) and the mixture.

    Only a leftover that is not a power of two can gain: a power-of-two leftover is already its own
    kept cell, holds no instance, or was dropped for copies of a smaller kept cell that beat it.
    """
    largest = cells[-1]
    leftover = budget % largest.gpus
    mix = _binary_decomposition(cells, budget)
    if leftover & (leftover - 1):  # neither 0 nor a power of two
        spare = max_throughput(model, leftover)
        decomposed = mixture_throughput(cells, _binary_decomposition(cells, leftover))
        if spare.throughput > decomposed * (1 + 1e-9):
            cells = [*cells, Cell(leftover, spare)]
            mix = +Counter({largest.gpus: budget // largest.gpus, leftover: 1})
    if not mix:
        fewest = fewest_instance_gpus(model, budget, cells[0].gpus)
        raise InfeasibleError(
            f"a budget of {budget} GPUs holds no complete instance of the model, which needs at least "
            f"{fewest} GPUs; give at least {fewest}"
        )
    return cells, mix


def fewest_instance_gpus(model: Model, too_few: int, enough: int) -> int:
    """The fewest GPUs holding a complete instance, by bisection between a count that holds none and one that does."""
    while enough - too_few > 1:
        middle = (too_few + enough) // 2
        if max_throughput(model, middle).throughput > 0:
            enough = middle
        else:
            too_few = middle
    return enough


MAX_PLAN_GPUS = 1_000_000  # a plan beyond this is a mistyped target or profile, not a deployment


def target_gpus_bound(cells: list[Cell], target: float) -> float:
    """A lower bound on the GPUs reaching `target`, with no mixture: kept cells grow more efficient
    per GPU with size, so no mixture beats the largest cell's rate per GPU."""
    largest = cells[-1]
    return target / largest.throughput * largest.gpus * (1 - 1e-9)  # less float noise


def check_plan_size(cells: list[Cell], target: float, gpus: float) -> None:
    """InfeasibleError when reaching `target` takes more than MAX_PLAN_GPUS GPUs (`gpus`, or a lower bound)."""
    if gpus > MAX_PLAN_GPUS:
        largest = cells[-1]
        count = f"{math.ceil(gpus):,}" if gpus < 1e15 else f"{gpus:.3g}"
        raise InfeasibleError(
            f"a target of {target:g} req/s needs at least {count} GPUs (one {largest.gpus}-GPU cell gives "
            f"{largest.throughput:.4g} req/s), more than the planner's limit of {MAX_PLAN_GPUS:,}; "
            "check the target and the profiled throughputs"
        )


def mixture_throughput(cells: list[Cell], mix: Counter[int]) -> float:
    """Requests/s of a mixture."""
    by_size = {c.gpus: c for c in cells}
    return sum(by_size[size].throughput * count for size, count in mix.items())


def ceil_div(a: float, b: float) -> int:
    """⌈a / b⌉ for positive b, robust to float noise."""
    return max(0, math.ceil(a / b - 1e-9))
