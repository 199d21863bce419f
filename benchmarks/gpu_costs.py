"""Real-size component costs on the GPU this runs on, against the cost model the paper simulations
assume (`benchmarks/paper/modserve_setup.py`).

Those simulations price an encoder call at a fixed overhead plus 2 x parameters x patches /
(MFU x peak) per item, MFU = 0.5, and an LLM's prefill at a seconds-per-token calibrated from the
ModServe paper's Figure 5, whose implied MFU they print. Nothing of that was measured. This script
measures it: the real models' components at their real sizes, with random weights (transformers'
own classes, bfloat16 (float32 on a CPU), SDPA attention; no checkpoint, no network), each forward timed with CUDA
events (median of `--repeats` after three warm-ups), its FLOPs counted by torch's FlopCounterMode:

- `internvit-6b`: the vision encoder of ModServe's InternVL-26B (45 layers, width 3200), on 1, 5
  and 20 tiles of 448 x 448 (1,025 patches each; 5 tiles is one of Table 1's images);
- `qwen2.5-vl-vit`: Qwen2.5-VL-7B's vision tower (32 layers, width 1280, windowed attention), on 1,
  4 and 16 images of 448 x 448 (1,024 patches each);
- `qwen2.5-7b-prefill`: a Qwen2.5-7B decoder (28 layers, width 3584, GQA 28/4) prefilling one
  sequence of 512, 2,048 and 8,192 tokens.

Per component it fits time = overhead + per-item x items (least squares over the shapes) and reports
the per-item MFU against the device's datasheet peak and against a bf16 8192^3 matrix product
measured in the same run, and each forward's own TFLOP/s and MFU. Decode steps are not measured: transformers decodes eagerly, one kernel
launch at a time, where vLLM replays CUDA graphs, so its step time would say nothing about vLLM's.

    python benchmarks/gpu_costs.py [--out FILE] [--repeats N]
    python benchmarks/gpu_costs.py --quick        # 1 layer, small shapes: a check of the script (CPU)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.paper (the simulations' constants), as a script too
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_costs.json"
# Dense bf16 peak from the vendors' datasheets (no sparsity), by a substring of torch's device name.
DATASHEET_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}


@dataclass(frozen=True)
class Component:
    """A component at its real size: how to build it with `layers` layers and one input of `items`."""

    name: str
    unit: str  # what one item is
    items: tuple[int, ...]
    quick_items: tuple[int, ...]
    layers: int
    build: Callable[[int, int], Any]  # (layers, image side in px)
    inputs: Callable[[int, int, str], dict[str, Any]]  # (items, image side in px, device)
    sim_note: str


def internvit(layers: int, side: int) -> Any:
    from transformers.models.internvl.configuration_internvl import InternVLVisionConfig
    from transformers.models.internvl.modeling_internvl import InternVLVisionModel

    config = InternVLVisionConfig(
        hidden_size=3200,
        num_hidden_layers=layers,
        num_attention_heads=25,
        intermediate_size=12800,
        use_qk_norm=True,
        norm_type="rms_norm",
        use_mean_pooling=False,
        image_size=side,
    )
    config._attn_implementation = "sdpa"
    return InternVLVisionModel(config)


def internvit_inputs(tiles: int, side: int, device: str) -> dict[str, Any]:
    import torch

    return {"pixel_values": torch.randn(tiles, 3, side, side, device=device)}


def qwen_vit(layers: int, side: int) -> Any:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    full = [7, 15, 23, 31] if layers == 32 else [layers - 1]  # every 8th layer attends fully
    config = Qwen2_5_VLVisionConfig(
        depth=layers,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=3584,
        fullatt_block_indexes=full,
        window_size=112,
    )
    config._attn_implementation = "sdpa"
    return Qwen2_5_VisionTransformerPretrainedModel(config)


def qwen_vit_inputs(images: int, side: int, device: str) -> dict[str, Any]:
    import torch

    patches = side // 14  # 448 px: 32 x 32 patches of 14 px
    grid = torch.tensor([[1, patches, patches]] * images, device=device)
    pixels = torch.randn(images * patches**2, 3 * 2 * 14 * 14, device=device)  # 2 frames a patch
    return {"hidden_states": pixels, "grid_thw": grid}


def qwen_llm(layers: int, side: int) -> Any:
    from transformers import Qwen2Config, Qwen2Model

    config = Qwen2Config(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=layers,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=1024,  # the prefill only looks embeddings up: the real 152,064 rows change nothing timed
        max_position_embeddings=32768,
    )
    config._attn_implementation = "sdpa"
    return Qwen2Model(config)


def qwen_llm_inputs(tokens: int, side: int, device: str) -> dict[str, Any]:
    import torch

    return {"input_ids": torch.randint(0, 1024, (1, tokens), device=device), "use_cache": False}


COMPONENTS = (
    Component(
        "internvit-6b",
        "tile",
        (1, 5, 20),
        (1, 2),
        45,
        internvit,
        internvit_inputs,
        "modserve_setup.INTERNVL: 2 x 5.9e9 x 1025 FLOPs a tile at MFU",
    ),
    Component(
        "qwen2.5-vl-vit",
        "image",
        (1, 4, 16),
        (1, 2),
        32,
        qwen_vit,
        qwen_vit_inputs,
        "the Qwen2.5-VL cost models' encoder (emulate/costs.py) is not derived from FLOPs",
    ),
    Component(
        "qwen2.5-7b-prefill",
        "token",
        (512, 2048, 8192),
        (16, 32),
        28,
        qwen_llm,
        qwen_llm_inputs,
        "modserve_setup: prefill seconds per token calibrated to 003 Figure 5",
    ),
)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_ms(run: Callable[[], Any], device: str, repeats: int) -> float:
    """Median milliseconds of `run` after three warm-ups: CUDA events on a GPU, the clock elsewhere."""
    import torch

    for _ in range(3):
        run()
    synchronize(device)
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def matmul_tflops(device: str, repeats: int, size: int) -> float:
    """What a size^3 matrix product reaches here: the attainable peak to set MFU against."""
    import torch

    a = torch.randn(size, size, device=device)  # the default dtype: main() sets it
    b = torch.randn(size, size, device=device)
    ms = time_ms(lambda: a @ b, device, repeats)
    return 2 * size**3 / (ms / 1e3) / 1e12


def fit(items: list[int], ms: list[float]) -> tuple[float, float]:
    """Least-squares overhead (ms) and per-item ms of time = overhead + per_item x items."""
    per_item, overhead = statistics.linear_regression(items, ms)
    return overhead, per_item


def count_flops(model: Any, inputs: dict[str, Any]) -> int:
    """The FLOPs of one forward, counted with eager attention: torch's counter cannot size SDPA with
    grouped-query heads (`enable_gqa`), and eager attention does the same products."""
    from torch.utils.flop_counter import FlopCounterMode

    timed = model.config._attn_implementation
    model.config._attn_implementation = "eager"  # read at each forward
    try:
        with FlopCounterMode(display=False) as counter:
            model(**inputs)
    finally:
        model.config._attn_implementation = timed
    return counter.get_total_flops()


def measure(component: Component, device: str, repeats: int, quick: bool) -> dict[str, Any]:
    """One component's forwards over its shapes: times, FLOPs, the linear fit and its MFU inputs."""
    import torch

    layers, side = (1, 112) if quick else (component.layers, 448)
    torch.manual_seed(0)
    began = time.perf_counter()
    with torch.device(device):
        model = component.build(layers, side).eval()
    synchronize(device)
    built_s = time.perf_counter() - began
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    shapes = []
    items = component.quick_items if quick else component.items
    with torch.inference_mode():
        for n in items:
            inputs = component.inputs(n, side, device)
            flops = count_flops(model, inputs)
            ms = time_ms(lambda inputs=inputs, model=model: model(**inputs), device, repeats)
            shapes.append({"items": n, "ms": round(ms, 3), "tflop": round(flops / 1e12, 4)})
    overhead, per_item = fit([s["items"] for s in shapes], [s["ms"] for s in shapes])
    result = {
        "unit": component.unit,
        "layers": layers,
        "image_side_px": side,
        "params": sum(p.numel() for p in model.parameters()),
        "build_s": round(built_s, 1),
        "shapes": shapes,
        "fit_overhead_ms": round(overhead, 3),
        "fit_ms_per_item": round(per_item, 5),
        "tflop_per_item": round(shapes[-1]["tflop"] / shapes[-1]["items"], 6),
        "sim": component.sim_note,
    }
    if device.startswith("cuda"):
        result["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def mfu(result: dict[str, Any], peak_tflops: float | None) -> float | None:
    """The FLOPs of one item over the fitted time per item, as a share of `peak_tflops`."""
    if not peak_tflops or result["fit_ms_per_item"] <= 0:
        return None
    return round(result["tflop_per_item"] / (result["fit_ms_per_item"] / 1e3) / peak_tflops, 3)


def simulation_assumptions() -> dict[str, Any]:
    """What the paper simulations assume, read from their module (so the comparison cannot drift);
    on a bare GPU machine without the planner's solver (highspy) only the reason it could not."""
    try:
        from benchmarks.paper import modserve_setup as setup
    except ImportError as missing:
        return {"unavailable": f"benchmarks.paper.modserve_setup not importable here: {missing}"}

    return {
        "encoder_mfu": setup.MFU,
        "encoder_call_overhead_ms": setup.BATCH_OVERHEAD_S * 1e3,
        "prefill_mfu": {m.name: round(m.prefill_mfu(), 3) for m in setup.MODELS.values()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--quick", action="store_true", help="1 layer, 112 px, short prompts: checks the script"
    )
    parser.add_argument("--only", nargs="+", choices=[c.name for c in COMPONENTS])
    args = parser.parse_args()
    import torch

    from prismserve.models.base import default_device

    device = default_device()  # PRISMSERVE_DEVICE, else what torch sees
    torch.backends.cuda.matmul.allow_tf32 = True
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32  # CPUs are slow at bf16
    torch.set_default_dtype(dtype)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu ({platform.machine()})"
    datasheet = (
        next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)
        if dtype == torch.bfloat16
        else None
    )
    matmul = matmul_tflops(device, args.repeats, 1024 if args.quick else 8192)
    print(f"{name}: {dtype} matmul {matmul:.2f} TFLOP/s (bf16 datasheet {datasheet})", flush=True)
    report: dict[str, Any] = {
        "device": device,
        "device_name": name,
        "torch": torch.__version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": args.quick,
        "repeats": args.repeats,
        "dtype": str(dtype),
        "datasheet_bf16_tflops": datasheet,
        "matmul_tflops": round(matmul, 3),
        "simulations_assume": simulation_assumptions(),
        "components": {},
    }
    for component in COMPONENTS:
        if args.only and component.name not in args.only:
            continue
        result = measure(component, device, args.repeats, args.quick)
        result["mfu_of_datasheet"] = mfu(result, datasheet)
        result["mfu_of_matmul"] = mfu(result, matmul)
        for shape in result["shapes"]:  # each forward's own, attention's growth with length in it
            shape["tflops"] = round(shape["tflop"] / (shape["ms"] / 1e3), 3)
            shape["mfu_of_datasheet"] = round(shape["tflops"] / datasheet, 3) if datasheet else None
        report["components"][component.name] = result
        shapes = ", ".join(f"{s['items']} {component.unit}s {s['ms']:.2f} ms" for s in result["shapes"])
        print(
            f"{component.name} ({result['params'] / 1e9:.2f} B params): {shapes}; fit {result['fit_overhead_ms']:.2f} ms "
            f"+ {result['fit_ms_per_item']:.4f} ms a {component.unit}; MFU {result['mfu_of_datasheet']} of the "
            f"datasheet, {result['mfu_of_matmul']} of the matmul",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"simulations assume: {report['simulations_assume']}; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
