#!/usr/bin/env bash
# Open-loop serving benchmark at the paper's Kimi-Linear point on ONE H200 (issue 14): Dense, SGLang's
# INT8 pool, dasc-nr w16 / w16+INT8 / w64 from the calibrated Kimi-Linear-48B-A3B reference
# (synthetic, calibrated to published statistics; not trained weights), equal running capacity
# (--max-running-requests MRR for every arm, 5*MRR native slots, extra_buffer) and equal state memory
# (Dense's DENSE_SLOTS + 1 slots). All arm servers are resident on the one GPU and measured in turn
# (benchmarks/run_open_loop.py); the load is calibrated on Dense.
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
#   .dev/ol/plans.tar.xz        the compiled plans and arms.json (python -m benchmarks.serving_arms)
# Run from the repo root on the device:
#   mkdir -p /tmp/olsrc && tar -xJf .dev/ol/src.tar.xz -C /tmp/olsrc && bash /tmp/olsrc/benchmarks/h200/open_loop_bench.sh
# Settings (env): MRR (8), NUM_EXPERTS (16), DEADLINE (s from the script's start, 575), ARMS (priority order),
#   RHO (0.7), LIVE (8: conversations waiting between turns per running request), STARTUP (driver s by which
#   the servers must be up, default LEFT - 190), DRIVER_FLAGS (more run_open_loop flags), LAUNCHER and PYTHON
#   (a CPU rehearsal: LAUNCHER="python tests/fake_sglang_server.py" skips the SGLang site).
# Results in $OUT: run.log, manifest.json, open-loop.tar.gz (per arm result.json, server.log).
set -uo pipefail
T0=$(date +%s)
CARRY=${CARRY:-$PWD}; SRC=${SRC:-/tmp/olsrc}
export OUT=${OUT:-/tmp/ol-out}; mkdir -p "$OUT"
MRR=${MRR:-8}; NUM_EXPERTS=${NUM_EXPERTS:-16}; DEADLINE=${DEADLINE:-575}; RHO=${RHO:-0.7}; LIVE=${LIVE:-8}
ARMS=${ARMS:-"dense dasc-nr-w16 int8 dasc-nr-w16-int8 dasc-nr-w64"}
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
rm -rf /tmp/ol-plans && mkdir -p /tmp/ol-plans && tar -xJf "$CARRY/.dev/ol/plans.tar.xz" -C /tmp/ol-plans || exit 3
mkdir -p /tmp/kimi16
"$PY" - "$SRC/plans/reference/kimi-linear-48b-a3b-calibrated/config.json" /tmp/kimi16/config.json "$NUM_EXPERTS" <<'EOF' || exit 3
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["num_experts"] = int(sys.argv[3])
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
print(f"model config: {sys.argv[2]} ({cfg['num_experts']} routed experts, {cfg['num_experts_per_token']} active)")
EOF
stamp "arms: $ARMS (MRR $MRR)"
cd "$SRC" || exit 3
LEFT=$(( DEADLINE - ($(date +%s) - T0) - 15 ))
extra=(); [ -n "${LAUNCHER:-}" ] && extra=(--launcher "$LAUNCHER")
"$PY" -m benchmarks.run_open_loop --arms-json /tmp/ol-plans/arms.json --plans /tmp/ol-plans --model /tmp/kimi16 \
    --trace "$CARRY/benchmarks/traces/sharegpt_qwen_n256_d1024_earliest_s0.json.gz" \
    --warm-trace "$CARRY/benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz" \
    --only $ARMS --max-running-requests "$MRR" --rho "$RHO" --live-per-running "$LIVE" \
    --deadline-s "$LEFT" --startup-deadline-s "${STARTUP:-$(( LEFT - 190 ))}" --work /tmp/ol "${extra[@]}" \
    ${DRIVER_FLAGS:---repeat-first} 2>&1 | tee "$OUT/run.log"
cp /tmp/ol/manifest.json "$OUT/manifest.json" 2>/dev/null
for f in /tmp/ol/*/server.log; do gzip -kf "$f"; done
tar -C /tmp -czf "$OUT/open-loop.tar.gz" --exclude=server.log ol
stamp done
