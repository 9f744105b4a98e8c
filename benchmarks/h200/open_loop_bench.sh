#!/usr/bin/env bash
# Open-loop serving benchmark at the paper's Kimi-Linear point on ONE H200 (issue 14): Dense, SGLang's
# INT8 pool, dasc-nr w16 / w16+INT8 / w64 (and, through ARMS, dasc-wr w16) from the calibrated
# Kimi-Linear-48B-A3B reference (synthetic, calibrated to published statistics; not trained weights),
# equal running capacity (--max-running-requests MRR for every arm, 5*MRR native slots, extra_buffer)
# and equal state memory (Dense's DENSE_SLOTS + 1 slots; dasc-wr's refresh scratch slots inside it).
# All arm servers are resident on the one GPU and measured in turn (benchmarks/run_open_loop.py); the
# load is calibrated on Dense, then a TTFT probe on Dense (never-cached prompts of 512-16000 tokens,
# one at a time) records TTFT = a + b * uncached tokens, how much of TTFT a cache hit can remove.
# Prompts: the long-prompt trace (initial 4,096-6,738 tokens, contexts to 15,583), served with a
# 16,640-token context: the 2026-12-01 run's 2.1k-token prompts left prefill a tenth of TTFT.
#
# Model: Kimi-Linear-48B-A3B's config with SGLang's dummy weights and NUM_EXPERTS routed experts
# (default 16 instead of 256; 8 active per token as in the real model, so the per-layer state shapes
# and the active compute per token stay; weights shrink from ~96 GB to ~10 GB, so five servers fit
# on one GPU and start faster; decode reads fewer expert weights than the real model would).
#
# Carried (git-ignored) folders, made on a CPU machine from one known-good commit:
#   .dev/sglang/site.tar.xz     SGLang 0.5.17 site (benchmarks/h200/sglang/build_site.sh)
#   .dev/dascwhl/dasc-*.whl     dasc, built from that commit
#   .dev/ol/src.tar.xz          that commit's benchmarks/ and dasc_compile/ (the client and driver run from it)
#   .dev/ol/plans.tar.xz        the compiled plans and arms.json (python -m benchmarks.serving_arms), made by
#                               benchmarks/h200/prepare_open_loop.sh (w16, w16+INT8, w64, w16 dasc-wr)
# Run from the repo root on the device:
#   mkdir -p /tmp/olsrc && tar -xJf .dev/ol/src.tar.xz -C /tmp/olsrc && bash /tmp/olsrc/benchmarks/h200/open_loop_bench.sh
# Settings (env): MRR (8), NUM_EXPERTS (16), DEADLINE (s from the script's start, 575), ARMS (priority order,
#   default "dense dasc-nr-w16 int8 dasc-nr-w16-int8 dasc-nr-w64"; any arm of arms.json, e.g. dasc-wr-w16),
#   TRACE (the measured conversations, relative to the repo root or absolute; default
#   benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_s0.json.gz), CONTEXT (--context-length, 16640),
#   MAX_TOTAL_TOKENS (each server's KV pool cap, 1000000), RHO (0.7), LIVE (8: conversations waiting between
#   turns per running request) or LIVE_WAITING (that number directly, e.g. 64: --live-waiting; replaces LIVE),
#   PROBE (TTFT probe lengths in tokens, e.g. "1024 8192"; unset: the driver's 512 2048 4096 8192 16000;
#   empty or "off": no probe), STARTUP (driver s by which the servers must be up, default LEFT - 190),
#   DRIVER_FLAGS (more run_open_loop flags, default --repeat-first), LAUNCHER and PYTHON (a CPU rehearsal:
#   LAUNCHER="python tests/support/fake_sglang_server.py" skips the SGLang site), OL_TMP (scratch root of the
#   plans, model config and driver work, default /tmp; a previous run's ol/ and ol-plans/ there are removed).
# Results in $OUT: run.log, manifest.json, open-loop.tar.gz (per arm result.json, server.log).
set -uo pipefail
T0=$(date +%s)
CARRY=${CARRY:-$PWD}; SRC=${SRC:-/tmp/olsrc}; W=${OL_TMP:-/tmp}
export OUT=${OUT:-/tmp/ol-out}; mkdir -p "$OUT"
MRR=${MRR:-8}; NUM_EXPERTS=${NUM_EXPERTS:-16}; DEADLINE=${DEADLINE:-575}; RHO=${RHO:-0.7}; LIVE=${LIVE:-8}
ARMS=${ARMS:-"dense dasc-nr-w16 int8 dasc-nr-w16-int8 dasc-nr-w64"}
TRACE=${TRACE:-benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_s0.json.gz}; case $TRACE in /*) ;; *) TRACE=$CARRY/$TRACE;; esac
CONTEXT=${CONTEXT:-16640}; MAX_TOTAL_TOKENS=${MAX_TOTAL_TOKENS:-1000000}
[ -f "$TRACE" ] || { echo "error: TRACE $TRACE: no such file" >&2; exit 2; }
load=(--live-per-running "$LIVE"); [ -n "${LIVE_WAITING:-}" ] && load=(--live-waiting "$LIVE_WAITING")
if [ -z "${PROBE+set}" ]; then probe=(); elif [ -z "$PROBE" ] || [ "$PROBE" = off ]; then probe=(--no-ttft-probe)
else read -ra probe <<< "$PROBE"; probe=(--ttft-probe-lengths "${probe[@]}"); fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
stamp "setup ($(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo no GPU))"
if [ -z "${LAUNCHER:-}" ]; then
  if [ ! -f /tmp/site/.done ]; then
    mkdir -p /tmp/site && tar -C /tmp/site -xJf "$CARRY/.dev/sglang/site.tar.xz" && touch /tmp/site/.done || exit 3
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$CARRY"/.dev/dascwhl/dasc-*.whl > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 3; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
PY=${PYTHON:-python3}
rm -rf "$W/ol-plans" "$W/ol" && mkdir -p "$W/ol-plans" && tar -xJf "$CARRY/.dev/ol/plans.tar.xz" -C "$W/ol-plans" || exit 3
mkdir -p "$W/kimi16"
"$PY" - "$SRC/plans/reference/kimi-linear-48b-a3b-calibrated/config.json" "$W/kimi16/config.json" "$NUM_EXPERTS" <<'EOF' || exit 3
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["num_experts"] = int(sys.argv[3])
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
print(f"model config: {sys.argv[2]} ({cfg['num_experts']} routed experts, {cfg['num_experts_per_token']} active)")
EOF
stamp "arms: $ARMS (MRR $MRR); trace $TRACE, context $CONTEXT, KV cap $MAX_TOTAL_TOKENS; ${load[*]}; probe ${probe[*]:-default}"
cd "$SRC" || exit 3
LEFT=$(( DEADLINE - ($(date +%s) - T0) - 15 ))
extra=(); [ -n "${LAUNCHER:-}" ] && extra=(--launcher "$LAUNCHER")
"$PY" -m benchmarks.run_open_loop --arms-json "$W/ol-plans/arms.json" --plans "$W/ol-plans" --model "$W/kimi16" \
    --trace "$TRACE" --warm-trace "$CARRY/benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz" \
    --context-length "$CONTEXT" --max-total-tokens "$MAX_TOTAL_TOKENS" "${probe[@]}" \
    --only $ARMS --max-running-requests "$MRR" --rho "$RHO" "${load[@]}" \
    --deadline-s "$LEFT" --startup-deadline-s "${STARTUP:-$(( LEFT - 190 ))}" --work "$W/ol" "${extra[@]}" \
    ${DRIVER_FLAGS:---repeat-first} 2>&1 | tee "$OUT/run.log"
cp "$W/ol/manifest.json" "$OUT/manifest.json" 2>/dev/null
for f in "$W"/ol/*/server.log; do [ -f "$f" ] && gzip -kf "$f"; done
tar -C "$W" -czf "$OUT/open-loop.tar.gz" --exclude=server.log ol
stamp done
