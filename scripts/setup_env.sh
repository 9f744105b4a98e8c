#!/usr/bin/env bash
# Create (or reuse) a virtual environment with dasc, its test tools and SGLang 0.5.17's cache
# classes, all running on a CPU. Usage: bash scripts/setup_env.sh [VENV_DIR]   (default .venv)
#
# Why these pins: SGLang 0.5.17 (the runtime's pinned version) imports torchvision at module level;
# torch 2.14.1 + torchvision 0.29.1 load together on a CPU (the CPU-only torch 2.13.0 wheel has no
# matching torchvision). SGLang itself pins torch 2.11 for its GPU kernels, so it is installed with
# --no-deps plus only what its cache code imports; its cache classes run on torch 2.14.1.
# triton comes with torch 2.14.1 and runs dasc's kernels on CPU under TRITON_INTERPRET=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-$ROOT/.venv}
MARK="$VENV/.dasc-env-v1"
if [ ! -f "$MARK" ]; then
  python3 -m venv "$VENV"
  P="$VENV/bin/python -m pip"
  $P install -q torch==2.14.1 torchvision==0.29.1
  $P install -q --no-deps sglang==0.5.17
  $P install -q -c <(echo torch==2.14.1) numpy orjson psutil pybase64 requests packaging pillow starlette \
    msgspec pydantic pyzmq tqdm IPython aiohttp dill gguf partial_json_parser "transformers==5.12.1" \
    "openai==2.6.1" "xgrammar==0.2.1" einops compressed-tensors sentencepiece "apache-tvm-ffi==0.1.11"
  touch "$MARK"
fi
# dasc itself (editable, so a checkout's edits are live) with its test tools and dasc eval's extras (ShareGPT prompts)
"$VENV/bin/python" -m pip install -q -c <(echo torch==2.14.1) -e "$ROOT[test,eval]"
echo "environment ready: $VENV"
