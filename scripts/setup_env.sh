#!/usr/bin/env bash
# Create (or reuse) a virtual environment with dasc, its test tools and SGLang's cache classes, all on a CPU.
#
#   bash scripts/setup_env.sh [VENV_DIR]              lowest: SGLang 0.5.17, transformers at dasc's lowest pin,
#                                                     torch 2.9.1 and dasc's other dependencies at their floors
#                                                     (scripts/floors.txt)
#   bash scripts/setup_env.sh VENV_DIR --newest       newest: SGLang 0.5.23, torch 2.14.1, the newest transformers
#                                                     and the newest release of every other dependency
#
# The environment's Python is `python3` on PATH, or the interpreter named by PYTHON (e.g.
# PYTHON=/root/.pyenv/versions/3.13.0/bin/python3.13): CI (.ci/run) builds the lowest environment on the lowest
# release pyproject's requires-python admits and the newest on the highest, where its machine has one that runs.
#
# The runtime supports SGLang 0.5.17 and 0.5.23; the releases between are refused (docs/sglang-versions.md).
# README's test command uses the lowest environment; CI (.ci/run) also builds the newest one and runs the
# version-sensitive tests there, and the tests of dasc's other dependencies at their newest releases.
#
# Why these pins: SGLang imports torchvision at module level, so torch comes with its matching torchvision:
# 2.9.1 + 0.24.1 (dasc's torch floor; PyPI's CUDA build, ~7.6 GB of venv with its CUDA wheels, runs on a CPU) in the lowest
# environment, 2.14.1 + 0.29.1 (what 0.5.23 pins; on this machine's disk) in the newest. SGLang 0.5.17 pins torch
# 2.11 and 0.5.23 torch 2.14.1 for their GPU kernels; both are installed with --no-deps plus only what their cache
# code (and 0.5.23's Engine, where dasc's keyword hook sits) imports; 0.5.17's cache classes run here on 2.9.1,
# 0.5.23's on 2.14.1.
# triton comes with torch (3.5 with 2.9.1) and runs dasc's kernels on CPU under TRITON_INTERPRET=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: bash scripts/setup_env.sh [VENV_DIR] [--newest]$1" >&2; exit 2; }
case "${1:-}" in -*) usage " (VENV_DIR comes first: bash scripts/setup_env.sh .venv-newest --newest; got '$1')";; esac
[ $# -le 2 ] || usage " (got $# arguments)"
VENV=${1:-$ROOT/.venv}
FLAVOUR=${2:-lowest}
PYTHON=${PYTHON:-python3}
WANT=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2> /dev/null) || WANT=""
case "$WANT" in
  [0-9]*.[0-9]*) ;;
  *) echo "error: PYTHON=$PYTHON does not run here as a Python (not on PATH, or a pyenv shim of a release pyenv does" \
       "not select); name an interpreter that runs, e.g. PYTHON=/path/to/python3.13" >&2; exit 2 ;;
esac
"$PYTHON" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' \
  || { echo "error: Python $WANT ($PYTHON): dasc needs Python >= 3.11, < 3.14 (pyproject's requires-python); name one" \
       "with PYTHON=/path/to/python3.X" >&2; exit 2; }
# --- transformers pin of the lowest environment (dasc eval's lowest supported release) -----------------
TRANSFORMERS_LOWEST="transformers==5.12.1"
# --- transformers of the newest environment ---------------------------------------------------------------
TRANSFORMERS_NEWEST="transformers==5.25.*"
# --- dasc's dependency floors (pyproject's lower bounds, as pip constraints) for the lowest environment ----------
FLOORS="$ROOT/scripts/floors.txt"
COMMON="numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm IPython aiohttp
  dill gguf partial_json_parser einops compressed-tensors sentencepiece apache-tvm-ffi==0.1.11"
case "$FLAVOUR" in
  lowest)   MARK="$VENV/.dasc-env-v3"; SGLANG="sglang==0.5.17"
            # torch's floor from floors.txt (one place), with the torchvision release built for it
            TORCH="$(grep -m1 '^torch==' "$FLOORS") torchvision==0.24.1"
            EXTRA="$TRANSFORMERS_LOWEST openai==2.6.1 xgrammar==0.2.1"
            PINS=(-c "$FLOORS")
            # the floors of numpy, matplotlib and PyYAML ship no wheels past Python 3.11: on a newer Python the
            # environment takes the newest releases of dasc's other dependencies and says so (torch stays at its
            # floor, which has wheels there; CI tests the floors on Python 3.11)
            if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
              echo "note: $("$PYTHON" -V): dasc's dependency floors (scripts/floors.txt) have no wheels for it;" \
                   "this environment gets their newest releases, torch's floor aside (CI tests the floors on Python 3.11)" >&2
              PINS=()
            fi ;;
  --newest) MARK="$VENV/.dasc-env-newest-v2"; SGLANG="sglang==0.5.23"; TORCH="torch==2.14.1 torchvision==0.29.1"
            EXTRA="$TRANSFORMERS_NEWEST openai==2.8.0 xgrammar==0.2.7 fastapi uvicorn uvloop setproctitle zstandard"
            PINS=() ;;
  *)        usage " (got '$FLAVOUR')" ;;
esac
# an environment of another Python release than $PYTHON's is rebuilt from empty, as one an older version of this
# script built (its marker has another version), so no wheel of the torch it held (its CUDA libraries: GBs) stays
# (or one whose python no longer runs: pyenv removed the release it points to)
HAVE=""
if [ -e "$VENV/bin/python" ] || [ -L "$VENV/bin/python" ]; then
  HAVE=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || HAVE="none"
fi
CLEAR=()
if [ -n "$HAVE" ] && [ "$HAVE" != "$WANT" ]; then
  if [ "$HAVE" = none ]; then echo "note: $VENV's python no longer runs: rebuilding it on Python $WANT ($PYTHON)" >&2
  else echo "note: $VENV holds Python $HAVE, not $WANT ($PYTHON): rebuilding it" >&2; fi
  rm -f "$MARK"; CLEAR=(--clear)
fi
if [ ! -f "$MARK" ]; then
  if compgen -G "$VENV/.dasc-env-*" > /dev/null; then CLEAR=(--clear); fi
  "$PYTHON" -m venv ${CLEAR[@]+"${CLEAR[@]}"} "$VENV"
  P="$VENV/bin/python -m pip"
  # shellcheck disable=SC2086
  $P install -q $TORCH
  $P install -q --no-deps "$SGLANG"
  # shellcheck disable=SC2086
  $P install -q -c <(echo "${TORCH%% *}") ${PINS[@]+"${PINS[@]}"} $COMMON $EXTRA
  touch "$MARK"
  BUILT=1
fi
# dasc itself (editable, so a checkout's edits are live) with its test tools and dasc eval's extras (ShareGPT prompts);
# the floors again, so a floor raised in scripts/floors.txt reaches an existing lowest environment too
"$VENV/bin/python" -m pip install -q -c <(echo "${TORCH%% *}") ${PINS[@]+"${PINS[@]}"} -e "$ROOT[test,eval]"
# pip prints its resolver's ERROR block while it builds the environment, not on a later run over a built one
[ -z "${BUILT:-}" ] || echo "note: pip's dependency-resolver ERROR block(s) above are expected (SGLang is installed" \
     "without its serving dependencies; README, Quick start): this script's exit status is what counts" >&2
echo "environment ready: $VENV ($FLAVOUR)"
