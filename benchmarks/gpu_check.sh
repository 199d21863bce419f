#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): every model family's tiny checkpoint run in process on
# cuda — split == monolith, engine batching, a memory share, per-component step times — written to
# benchmarks/results/gpu_check.json (--out). PRISMSERVE_DEVICE=cpu runs it on the CPU (CI).
#
# A bare GPU machine has torch and transformers but not everything prismserve needs: put the wheels
# benchmarks/README.md lists ("GPU check") in a folder and name it in GPU_CHECK_WHEELS; they are
# installed into a scratch folder for this run only (no network, no change to the system).
#   GPU_CHECK_WHEELS=.whl benchmarks/gpu_check.sh [--families ...] [--quick] [--out FILE]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null 2>&1; then
            python="$candidate"
            break
        fi
    done
fi
if [[ -z "$python" ]]; then
    echo "error: no python3 on PATH; install Python 3.11+ or name one in PYTHON=/path/to/python3" >&2
    exit 2
fi

if [[ -n "${GPU_CHECK_WHEELS:-}" ]]; then
    site="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")"
    trap 'rm -rf "$site"' EXIT
    shopt -s nullglob
    wheels=("$GPU_CHECK_WHEELS"/*.whl)
    if ((${#wheels[@]} == 0)); then
        echo "error: GPU_CHECK_WHEELS=$GPU_CHECK_WHEELS holds no .whl files" >&2
        exit 2
    fi
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$python" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${wheels[@]}"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

# What the check imports, with the lowest versions prismserve takes (pyproject.toml); found without
# importing the heavy ones, so that the list of what is missing comes in a second. The audio
# packages are needed only for the Omni families, diffusers only for Qwen-Image (--families).
"$python" - "$@" <<'EOF'
import importlib.metadata as metadata
import importlib.util
import sys

NEEDED = {  # import name: (distribution, lowest version, why)
    "torch": ("torch", "2.4", "the models"),
    "transformers": ("transformers", "5.20", "the models (prismserve's families need 5.20+)"),
    "tokenizers": ("tokenizers", "0.22", "the tiny checkpoints' tokenizers"),
    "safetensors": ("safetensors", "0.5", "checkpoint files"),
    "accelerate": ("accelerate", "1.10", "from_pretrained(device_map=...)"),
    "diffusers": ("diffusers", "0.40", "Qwen-Image"),
    "numpy": ("numpy", "1.26", "everything"),
    "PIL": ("pillow", "10", "images"),
    "pydantic": ("pydantic", "2.7", "prismserve's protocol and task types"),
    "av": ("av", "14", "audio decoding (PyAV), the Omni families"),
    "soxr": ("soxr", "0.5", "audio resampling, the Omni families"),
}

ALL = {"qwen2.5-vl", "internvl3", "gemma3", "qwen2.5-omni", "qwen3-omni", "qwen-image"}


def families(argv):
    """The families --families names (all when it is not given)."""
    if "--families" not in argv:
        return ALL
    named = []
    for arg in argv[argv.index("--families") + 1 :]:
        if arg.startswith("-"):
            break
        named.append(arg)
    return set(named)


wanted = families(sys.argv[1:])
if not wanted & {"qwen2.5-omni", "qwen3-omni"}:
    del NEEDED["av"], NEEDED["soxr"]
if "qwen-image" not in wanted:
    del NEEDED["diffusers"]


def version(text):
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


missing = []
for module, (dist, lowest, why) in NEEDED.items():
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a broken install is as good as none
        spec = None
    if spec is None:
        missing.append(f"  {dist}>={lowest}  ({why}): not installed")
        continue
    try:
        found = metadata.version(dist)
    except metadata.PackageNotFoundError:
        continue  # importable without metadata (a source tree): take it
    if version(found) < version(lowest):
        missing.append(f"  {dist}>={lowest}  ({why}): {found} is installed")
if missing:
    print("error: the GPU check needs:\n" + "\n".join(missing), file=sys.stderr)
    print(
        "install them (pip install 'prismserve[models]' where a registry is reachable), or on a machine\n"
        "without one download the wheels elsewhere (benchmarks/README.md, 'GPU check') and run\n"
        "  GPU_CHECK_WHEELS=<folder of wheels> benchmarks/gpu_check.sh",
        file=sys.stderr,
    )
    sys.exit(2)
EOF

# Not exec: the scratch folder of GPU_CHECK_WHEELS is removed when the check ends.
status=0
"$python" "$here/gpu_check.py" "$@" || status=$?
exit "$status"
