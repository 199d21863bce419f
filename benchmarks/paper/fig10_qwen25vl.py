"""000 Figure 10's Qwen2.5-VL half: a Qwen2.5-VL-32B-like model on 16 GPUs, the controlled workloads of Table 3.

The same experiment as fig10_internvl3.py (its functions, this model): Monolith (EPD on 2 GPUs),
E/PD, EP/D, E/P/D with replica counts the planner picks within their options, and the planner's own
plan over every option, which the server makes for itself at start. 000 §7.3.2 finds the monolith
best on every workload for Qwen2.5-VL (its 0.67B encoder is too small to deserve a GPU of its own)
and the planner matching it.
Run: python benchmarks/paper/fig10_qwen25vl.py [--requests 1000] [--speedup 4] [--quick] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fig10_internvl3 import details_for, rows_for, run_figure  # noqa: E402

from prismserve.emulate.catalog import MLLM_BASELINES, QWEN25_VL  # noqa: E402

NAME = "fig10_qwen25vl"
PAPER = dict.fromkeys(
    ("Lower resolution", "Standard", "Less text", "Fewer images"), "≈ 1 (Monolith best, plan matches it)"
)


def main() -> None:
    run_figure(QWEN25_VL, MLLM_BASELINES, NAME, "Qwen2.5-VL-32B-like", __doc__ or "")


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    return rows_for(results, NAME, "Qwen2.5-VL", PAPER)


def details(results: Path) -> str:
    return details_for(results, NAME)


if __name__ == "__main__":
    main()
