"""The papers' experiments `prismserve bench paper` runs, and where each one's README rows come from.

Each script writes its JSON (and PNG plots) under the results folder given by its `out` flag; the
module (the script itself unless named) has `rows(results)` and may have `details(results)`.
`args` is the run the README's figures come from (`more`: further runs of the same script, one
process each), `quick` a small one (a smoke test).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Experiment:
    name: str
    script: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)
    out: str = "--out"  # the script's flag for the results folder
    more: tuple[tuple[str, ...], ...] = ()
    module: str = field(default="")

    def __post_init__(self) -> None:
        if not self.module:
            object.__setattr__(self, "module", self.script)


EXPERIMENTS = [
    Experiment(
        "fig6a",
        "fig6a_omni.py",
        ("--requests", "2000"),
        ("--gpus", "8", "--requests", "40", "--speedup", "50"),
        out="--results",
    ),
    Experiment("fig10-internvl3", "fig10_internvl3.py", ()),
    Experiment("fig6b", "fig6b_qwen3_omni.py", ()),
    Experiment("fig9", "fig9_servegen.py", ()),
    Experiment("fig10-qwen25vl", "fig10_qwen25vl.py", ()),
    Experiment("fig11", "fig11_latency_cdf.py", ()),
    Experiment("sec733", "sec733_qwen_image.py", ("--requests", "300")),
    Experiment("sec74", "sec74_routing.py", ("--requests", "400")),
    Experiment("dataplane", "dataplane_sweep.py", ()),
    Experiment("startup", "startup.py", ()),
    Experiment(
        "modserve",
        "modserve.py",
        ("--requests", "500", "--bisections", "4", "--figures", "fig14,fig17,fig18,fig19"),
        more=(
            ("--requests", "500", "--bisections", "4", "--figures", "fig15", "--slo-scale", "20"),
            ("--requests", "500", "--figures", "fig16"),
        ),
    ),
    Experiment(
        "triinfer",
        "triinfer.py",
        ("--requests", "3000"),
        ("--quick",),
        out="--results",
    ),
]

# The sim engines checked against the real ones (not a paper figure; its script lives in benchmarks/).
EXPERIMENTS.append(Experiment("twin", "../twin.py", ("--repeats", "2")))
