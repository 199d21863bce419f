"""The GPU check: every model family prismserve ships, as tiny random-weight checkpoints, run in this
process on `cuda` (or the CPU with PRISMSERVE_DEVICE=cpu, as CI runs it), through the package's own
adapters and transformers engine: no Ray, no vLLM, no HTTP server, no network.

Per family it checks and prints:
- split == monolith: the components loaded as separate deployments (encoders, LLM / thinker, talker,
  vocoder; Qwen-Image's text encoder and DiT + VAE) compute what the whole model computes (greedy
  tokens and logits within 1e-4, audio within 1e-4 of its peak, PNG pixels identical), as the
  equality tests under tests/models compare them;
- batching: concurrent requests to one `HFEngine` decode together (fewer decoding steps than one
  request at a time would take, each request's tokens as when it runs alone); Qwen-Image: two
  paintings in one pipeline call take the DiT forwards of one;
- step times: median milliseconds per forward of each component (encoders per call, LLM prefill and
  decode forwards, talker forwards, vocoder per utterance, DiT forwards (two per denoising step with
  guidance), VAE decode).
Once: a memory share is honoured (`executors.loading.model_adapter` of a replica given 0.5 GPU:
torch's allocator refuses more than its share); skipped on the CPU, where no share applies.

Results go to `--out` (default benchmarks/results/gpu_check.json) with the device's name; the exit
status is 0 only when every check passed. Run through benchmarks/gpu_check.sh (it checks imports).
Equality runs in full float32 (TF32 off), the dtype the tiny checkpoints are saved in.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import json
import os
import platform
import statistics
import sys
import time
import wave
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this source tree, from any working directory

import numpy as np  # noqa: E402

import prismserve  # noqa: E402,F401  (telemetry off)
from prismserve.offline import go_offline  # noqa: E402

FAMILIES = ("qwen2.5-vl", "internvl3", "gemma3", "qwen2.5-omni", "qwen3-omni", "qwen-image")
VISION_LLMS = ("qwen2.5-vl", "internvl3", "gemma3")
OMNI = ("qwen2.5-omni", "qwen3-omni")
LOGIT_ATOL = 1e-4  # as tests/models compare logits
AUDIO_ATOL = 1e-4  # of the audio's peak
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"


# --- media, made here: the machine may hold no workloads folder --------------------------------------
def png(width: int, height: int, seed: int) -> bytes:
    """A PNG of a gradient with random blocks: varied pixels, so that embeddings carry signal."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    pixels = np.broadcast_to(ramp, (height, width, 3)).copy()
    pixels += (
        rng.integers(0, 80, (height // 8 + 1, width // 8 + 1, 3)).repeat(8, 0).repeat(8, 1)[:height, :width]
    )
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def wav(seconds: float = 1.2, rate: int = 24000) -> bytes:
    """A 16-bit mono WAV of a chirp and noise at 24 kHz (the encoders resample it to 16 kHz)."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(3)
    signal = 0.5 * np.sin(2 * np.pi * (200 + 400 * t) * t) + 0.05 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


# --- step times ------------------------------------------------------------------------------------
class Steps:
    """Wall-clock times of component calls and forwards, the device synchronised at both ends (CUDA
    runs asynchronously: without it a forward would look as long as its kernel launches)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.times: dict[str, list[float]] = defaultdict(list)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    @contextlib.contextmanager
    def call(self, name: str) -> Iterator[None]:
        """Time what runs inside as one call of component `name`."""
        self.sync()
        start = time.perf_counter()
        yield
        self.sync()
        self.times[name].append(time.perf_counter() - start)

    @contextlib.contextmanager
    def forwards(self, module: Any, name: str, phases: bool = True) -> Iterator[None]:
        """Time every forward of `module` meanwhile, as `name-prefill` (more than one position in)
        and `name-decode` (one), or as `name` when `phases` is off."""
        started: list[float] = []

        def before(_module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            self.sync()
            started.append(time.perf_counter())

        def after(_module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
            self.sync()
            elapsed = time.perf_counter() - started.pop()
            self.times[f"{name}-{_phase(args, kwargs)}" if phases else name].append(elapsed)

        handles = [
            module.register_forward_pre_hook(before, with_kwargs=True),
            module.register_forward_hook(after, with_kwargs=True),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def summary(self, warmup: int = 1) -> dict[str, dict[str, float]]:
        """Median ms per call of each component (its first `warmup` calls dropped when it has more:
        on CUDA they include kernel selection and the allocator's first growth)."""
        out = {}
        for name, times in sorted(self.times.items()):
            kept = times[warmup:] if len(times) > warmup else times
            out[name] = {"median_ms": round(1000 * statistics.median(kept), 3), "calls": len(kept)}
        return out


def _phase(args: Any, kwargs: dict[str, Any]) -> str:
    """'prefill' when a forward takes more than one new position, else 'decode'."""
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if value is not None and getattr(value, "ndim", 0) >= 2:
            return "prefill" if value.shape[1] > 1 else "decode"
    value = args[0] if args else None
    if value is not None and getattr(value, "ndim", 0) >= 2:
        return "prefill" if value.shape[1] > 1 else "decode"
    return "call"


def repeat(steps: Steps, name: str, fn: Callable[[], Any], times: int) -> Any:
    """`fn()` `times` times, each timed as a call of `name`; the last result."""
    result = None
    for _ in range(times):
        with steps.call(name):
            result = fn()
    return result


# --- the checks ------------------------------------------------------------------------------------
def max_diff(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def logits_equality(split: Any, whole: Any, what: str) -> dict[str, Any]:
    """Greedy tokens equal and logits within LOGIT_ATOL."""
    tokens_equal = split.token_ids == whole.token_ids
    diff = max_diff(split.logits, whole.logits) if tokens_equal else float("inf")
    return {
        "compared": what,
        "tokens": len(whole.token_ids),
        "tokens_equal": tokens_equal,
        "max_logit_diff": diff,
        "equal": tokens_equal and diff <= LOGIT_ATOL,
    }


def engine_batching(adapter: Any, requests: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """Submit `requests` at once to one `HFEngine` and count its decoding steps: batched, they take
    fewer than one request at a time would (the sum of each request's steps); each request's tokens
    must be those of transformers' `generate` run on it alone."""
    from prismserve.executors.hf_engine import HFEngine

    alone = [adapter.generate(inputs, max_tokens, with_logits=True) for inputs in requests]
    engine = HFEngine(adapter, max_batch=len(requests))
    rows: list[int] = []
    step = engine._step

    def counted(batch: Any) -> bool:
        stepped = step(batch)
        if stepped:
            rows.append(len(batch.rows))
        return stepped

    engine._step = counted  # type: ignore[method-assign]  # the engine thread looks it up per step
    try:
        futures = [engine.submit(inputs, max_tokens, with_logits=True) for inputs in requests]
        batched = [future.result(timeout=300) for future in futures]
    finally:
        engine.close()
    serial = sum(max(0, len(g.token_ids) - 1) for g in alone)  # the first token comes from the prefill
    tokens_equal = [b.token_ids for b in batched] == [a.token_ids for a in alone]
    # Where the tokens agree, how far the batched logits are from each request's alone (a diagnosis).
    diff = (
        max(max_diff(b.logits, a.logits) for b, a in zip(batched, alone, strict=True))
        if tokens_equal
        else None
    )
    return {
        "requests": len(requests),
        "decode_steps": len(rows),
        "serial_decode_steps": serial,
        "peak_batch": engine.peak_batch,
        "tokens_equal_alone": tokens_equal,
        "max_logit_diff_alone": diff,
        "batched": engine.peak_batch >= 2 and len(rows) < serial and tokens_equal,
    }


def vision_llm(path: str, device: str, steps: Steps, tokens: int, repeats: int) -> dict[str, Any]:
    """Encoder | LLM split vs the monolith (LLM with its encoders), and the LLM's engine batching."""
    from prismserve.models import MediaInput, adapter_for
    from prismserve.protocol.chat import ChatRequest
    from prismserve.tasklib import conversation

    encoder, llm, monolith = (adapter_for(path, device) for _ in range(3))
    encoder.load_encoder("image")
    llm.load_llm(with_encoders=False)
    monolith.load_llm(with_encoders=True)
    images = [png(120, 80, 1), png(60, 60, 2)]
    messages, media = conversation(ChatRequest.of("Compare the two pictures.", images=images))
    encoded = repeat(
        steps, "image-encoder", lambda: encoder.encode("image", [m.data for m in media]), repeats
    )
    with steps.forwards(llm.llm(), "llm"):
        split = llm.generate(llm.llm_inputs(messages, encoded=encoded), tokens, with_logits=True)
    raw = monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    whole = monolith.generate(raw, tokens, with_logits=True)
    equality = logits_equality(
        split, whole, f"encoder -> LLM vs the monolith: {tokens} greedy tokens and logits"
    )
    return {"equality": equality, "batching": engine_batching(llm, llm_requests(llm, encoder), tokens)}


def llm_requests(llm: Any, encoder: Any, modality: str = "image") -> list[dict[str, Any]]:
    """Four requests of different lengths for the split LLM: two text-only, two with an encoded item."""
    from prismserve.protocol.chat import ChatRequest
    from prismserve.tasklib import conversation

    prompts = [
        ChatRequest.of("What is prismserve?"),
        ChatRequest.of("Describe the sound of the cars parked on the street, then thank you."),
    ]
    images, audios = ([png(90, 60, 4)], []) if modality == "image" else ([], [wav(0.8)])
    prompts += [
        ChatRequest.of(text, images=images, audios=audios)
        for text in ("What is here?", "Tell me more about it.")
    ]
    out = []
    for request in prompts:
        messages, items = conversation(request)
        encoded = [encoder.encode(m.modality, [m.data])[0] for m in items]
        out.append(llm.llm_inputs(messages, encoded=encoded))
    return out


def omni(path: str, device: str, steps: Steps, tokens: int, codes: int, repeats: int) -> dict[str, Any]:
    """Image and audio encoders, thinker, talker and vocoder as separate parts vs transformers' own
    end-to-end `generate` (text, logits and audio); the thinker's engine batching."""
    from prismserve.models import MediaInput, adapter_for
    from prismserve.protocol.chat import ChatRequest
    from prismserve.tasklib import conversation

    parts = {name: adapter_for(path, device) for name in ("image", "audio", "thinker", "talker", "vocoder", "monolith")}  # fmt: skip
    parts["image"].load_encoder("image")
    parts["audio"].load_encoder("audio")
    parts["thinker"].load_llm(with_encoders=False)
    parts["talker"].load_talker()
    parts["vocoder"].load_vocoder()
    parts["monolith"].load_monolith()
    request = ChatRequest.of("Answer aloud.", images=[png(120, 80, 1)], audios=[wav()])
    messages, media = conversation(request)
    monolith = parts["monolith"]
    speaker = monolith.speaker(None)
    raw = monolith.llm_inputs(messages, media=[MediaInput(m.modality, m.data) for m in media])
    whole_tokens, whole_wav = monolith.generate_all(raw, tokens, codes, speaker, seed=7)
    whole = monolith.generate(raw, tokens, with_logits=True)

    def encode(item: Any) -> Any:
        return parts[item.modality].encode(item.modality, [item.data])[0]

    encoded = [repeat(steps, f"{m.modality}-encoder", functools.partial(encode, m), repeats) for m in media]
    thinker, talker, vocoder = parts["thinker"], parts["talker"], parts["vocoder"]
    inputs = thinker.llm_inputs(messages, encoded=encoded)
    with steps.forwards(thinker.llm(), "thinker"):
        thought = thinker.generate(inputs, tokens, with_logits=True, with_hidden=True)
    with steps.forwards(talker.model.talker, "talker"):
        spoken = talker.talk(thinker.talker_inputs(inputs, thought, speaker), codes)
    audio = repeat(
        steps, "vocoder-utterance", lambda: vocoder.vocode(spoken, speaker, seed=7), max(1, repeats // 2)
    )
    equality = logits_equality(
        thought, whole, f"encoders -> thinker vs the monolith: {tokens} greedy tokens and logits"
    )
    peak = float(np.abs(whole_wav).max())
    same_shape = audio.shape == whole_wav.shape
    audio_diff = max_diff(audio, whole_wav) if same_shape else float("inf")
    equality.update(
        compared=equality["compared"] + "; thinker -> talker -> vocoder vs transformers' generate: audio",
        monolith_tokens_equal=thought.token_ids == whole_tokens,
        codes=len(spoken),
        audio_samples=int(audio.size),
        audio_peak=peak,
        max_audio_diff_of_peak=audio_diff / peak if peak else float("inf"),
    )
    equality["equal"] = bool(
        equality["equal"]
        and equality["monolith_tokens_equal"]
        and peak > 0.05
        and audio_diff <= AUDIO_ATOL * peak
    )
    batching = engine_batching(thinker, llm_requests(thinker, parts["audio"], "audio"), tokens)
    return {"equality": equality, "batching": batching}


def qwen_image(path: str, device: str, steps: Steps, repeats: int) -> dict[str, Any]:
    """Text encoder | DiT + VAE split vs the whole pipeline (identical PNG pixels), and two paintings
    in one pipeline call (the DiT forwards of one)."""
    from PIL import Image

    from prismserve.models import adapter_for
    from prismserve.models.qwen_image import Painting

    encoder, generator, whole = (adapter_for(path, device) for _ in range(3))
    encoder.load_text_encoder()
    generator.load_generator()
    whole.load_monolith()
    shape: dict[str, Any] = {"width": 64, "height": 48, "steps": 4, "guidance": 4.0}
    prompt = "a red car on a street"
    embeds = repeat(steps, "text-encoder", lambda: encoder.encode_prompt(prompt), repeats)
    negative = encoder.encode_prompt("blurry")
    pipeline = generator.pipeline
    decode = pipeline.vae.decode

    def timed_decode(*args: Any, **kwargs: Any) -> Any:
        with steps.call("vae-decode"):
            return decode(*args, **kwargs)

    pipeline.vae.decode = timed_decode
    with steps.forwards(pipeline.transformer, "dit-forward", phases=False):
        split = repeat(steps, "generator-image", lambda: generator.generate(embeds=embeds, negative=negative, seed=11, **shape), max(1, repeats // 2))  # fmt: skip
    monolith = whole.generate(prompt, negative_prompt="blurry", seed=11, **shape)

    def pixels(data: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(data)))

    equal = bool(np.array_equal(pixels(split), pixels(monolith)))
    equality = {
        "compared": f"text encoder -> DiT + VAE vs the whole pipeline: {shape['width']}x{shape['height']} PNG pixels",
        "equal": equal and pixels(split).shape == (shape["height"], shape["width"], 3),
        "max_pixel_diff": int(np.abs(pixels(split).astype(int) - pixels(monolith)).max()),
    }
    forwards: list[int] = []

    def count(_module: Any, _args: Any, _output: Any) -> None:
        forwards[-1] += 1

    handle = pipeline.transformer.register_forward_hook(count)
    paintings = [Painting(embeds=embeds, negative=negative, seed=s, **shape) for s in (1, 2)]
    try:
        forwards.append(0)
        together = generator.paint(paintings)
        alone = []
        for painting in paintings:
            forwards.append(0)
            alone.append(generator.paint([painting])[0])
    finally:
        handle.remove()
    close = all(
        int(np.abs(pixels(a).astype(int) - pixels(b)).max()) <= 1
        for a, b in zip(together, alone, strict=True)
    )
    batching = {
        "requests": len(paintings),
        "dit_forwards_together": forwards[0],
        "dit_forwards_alone": sum(forwards[1:]),
        "images_equal_alone": close,  # within 1 of 255, as tests/models/test_qwen_image.py allows
        "batched": forwards[0] < sum(forwards[1:]) and close,
    }
    return {"equality": equality, "batching": batching}


def memory_share(device: str, path: str) -> dict[str, Any]:
    """A replica given 0.5 GPU (`executors.loading.model_adapter`, as a replica loads its model) can
    allocate within its share of the GPU and not beyond it."""
    from prismserve.executors.loading import memory_fraction, model_adapter
    from prismserve.tasklib.units import EncoderTask

    gpus = 0.5
    task = EncoderTask(model=path, modality="image", gpus=gpus)
    if not device.startswith("cuda"):
        assert memory_fraction(gpus, device) is None  # the CPU takes no share
        model_adapter(task)  # the replica's path, which sets no share here
        return {
            "skipped": True,
            "why": f"device {device}: torch.cuda.set_per_process_memory_fraction limits CUDA's allocator only; "
            "memory_fraction() gives no share off CUDA",
        }
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    adapter = model_adapter(task)
    index = torch.device(adapter.device).index or 0
    total = torch.cuda.get_device_properties(index).total_memory
    result: dict[str, Any] = {"gpus": gpus, "total_gib": round(total / 2**30, 2)}

    def allocates(share: float) -> bool:
        try:
            block = torch.empty(int(share * total), dtype=torch.uint8, device=adapter.device)
            del block
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            torch.cuda.empty_cache()

    try:
        result["within_allocated"] = allocates(gpus - 0.1)
        result["beyond_allocated"] = allocates(gpus + 0.1)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    # The refusal was the share's, not a full GPU: without it the same block allocates.
    result["beyond_allocated_without_share"] = allocates(gpus + 0.1)
    result["honoured"] = (
        result["within_allocated"]
        and not result["beyond_allocated"]
        and result["beyond_allocated_without_share"]
    )
    return result


# --- the run ---------------------------------------------------------------------------------------
def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def pick_device() -> str:
    """PRISMSERVE_DEVICE when set, else cuda when torch sees a GPU, else cpu; a CUDA device asked for
    where torch sees none is an error that says what to do."""
    import torch

    from prismserve.models.base import requested_device

    device = requested_device() or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(
            f"error: PRISMSERVE_DEVICE={device} but torch {torch.__version__} sees no CUDA device: "
            "run on a GPU machine with a CUDA build of torch, or set PRISMSERVE_DEVICE=cpu"
        )
    return device


def check_family(family: str, device: str, tokens: int, codes: int, repeats: int) -> dict[str, Any]:
    """One family's checks and step times."""
    import torch

    from prismserve.models import tiny

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    path = str(tiny.build(family))
    built = time.perf_counter() - start
    steps = Steps(device)
    if family in VISION_LLMS:
        result = vision_llm(path, device, steps, tokens, repeats)
    elif family in OMNI:
        result = omni(path, device, steps, tokens, codes, repeats)
    else:
        result = qwen_image(path, device, steps, repeats)
    result["steps_ms"] = steps.summary()
    result["checkpoint"] = path
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["build_seconds"] = round(built, 2)
    if device.startswith("cuda"):  # every part of the family loaded at once: split and monolith
        result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    result["ok"] = bool(result["equality"]["equal"] and result["batching"]["batched"])
    return result


def report(family: str, result: dict[str, Any]) -> None:
    """Print one family's outcome and step times."""
    equality, batching = result["equality"], result["batching"]
    verdict = "ok" if result["ok"] else "FAILED"
    print(f"\n== {family}: {verdict} ({result['seconds']} s)", flush=True)
    detail = {k: v for k, v in equality.items() if k not in ("compared", "equal")}
    print(f"  split == monolith: {equality['equal']}  ({equality['compared']}; {detail})")
    print(
        f"  engine batching:   {batching['batched']}  { ({k: v for k, v in batching.items() if k != 'batched'}) }"
    )
    for name, row in result["steps_ms"].items():
        print(f"  {name:<20} {row['median_ms']:10.3f} ms median of {row['calls']}")


def main() -> int:
    go_offline()  # tiny checkpoints are built here; never reach the hub
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--tokens", type=int, default=8, help="greedy tokens per LLM / thinker request")
    parser.add_argument("--codes", type=int, default=40, help="talker codes per utterance")
    parser.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="timed calls of each encoder (the first a warm-up; half as many of the generators)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the results file (JSON)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI's CPU run: 4 tokens, 12 codes, 2 encoder calls, 1 vocoder call",
    )
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.codes, args.repeats = 4, 12, 2
    if min(args.tokens, args.codes, args.repeats) < 1:
        parser.error("--tokens, --codes and --repeats take numbers from 1 up")

    import torch
    import transformers

    # Equality in full float32, as on the CPU: TF32 would round matmuls and convolutions differently
    # in the split and the whole model.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = pick_device()
    print(
        f"device {device}: {device_name(device)}; torch {torch.__version__}, transformers {transformers.__version__}"
    )
    started = time.perf_counter()
    families: dict[str, Any] = {}
    for family in args.families:
        families[family] = check_family(family, device, args.tokens, args.codes, args.repeats)
        report(family, families[family])
    from prismserve.models import tiny

    share = memory_share(device, str(tiny.build("qwen2.5-vl")))
    print(f"\nmemory share: {share}")
    # The in-process path must not pull in the serving stack (a bare GPU machine has none of it).
    serving = sorted(name for name in ("ray", "vllm", "fastapi", "uvicorn") if name in sys.modules)
    if serving:
        print(f"\nimported the serving stack, which a bare machine lacks: {serving}")
    ok = (
        all(r["ok"] for r in families.values())
        and (share.get("skipped") or share["honoured"])
        and not serving
    )
    results = {
        "device": device,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.perf_counter() - started, 2),
        "settings": {
            "tokens": args.tokens,
            "codes": args.codes,
            "repeats": args.repeats,
            "dtype": "float32, TF32 off",
        },
        "families": families,
        "memory_share": share,
        "serving_stack_imported": serving,
        "ok": bool(ok),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'} in {results['seconds']} s; results in {args.out}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
