#!/usr/bin/env bash
# The test suite's GPU-only tests (`-m gpu`: the generated Triton pack / load kernels against the PyTorch
# reference on CUDA, the restore path without host syncs under torch.cuda.set_sync_debug_mode, the side-stream
# ordering of demotion), which CI can never run. From the repo root of a device call, alone or chained before or
# after a serving driver (the site and the dasc wheel are installed once per machine and shared):
#   bash benchmarks/h200/gpu_tests.sh            carry .dev/sglang and .dev/dascwhl (as chat_bench.sh does)
# dasc comes from the carried wheel (tests import `dasc_runtime`, which only an install provides: a plain
# checkout on PYTHONPATH fails to collect, session 19), SGLang and pydantic from the carried site.
# Settings (env): GPU_TESTS_TIMEOUT (s, 150). Writes OUT/gpu-tests.log; exit status pytest's (3: no site).
set -uo pipefail
export OUT=${OUT:-/tmp/gpu-tests-out}; mkdir -p "$OUT"
source benchmarks/h200/site_env.sh && dasc_site "$PWD/.dev/sglang/site.tar.xz" "$OUT" || exit 3
jit_env
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
timeout "${GPU_TESTS_TIMEOUT:-150}" python3 -m pytest -m gpu -v -p no:cacheprovider -rs \
    tests/kernels tests/runtime > "$OUT/gpu-tests.log" 2>&1
rc=$?
echo "gpu tests: exit $rc ($(tail -n 1 "$OUT/gpu-tests.log"))" | tee -a "$OUT/gpu-tests.log"
exit $rc
