#!/usr/bin/env bash
# dasc-wr on an H200, in ONE device call of <= 300 s (recipe: benchmarks/h200/README.md).
#
# SGLang 0.5.17 serves the tiny Qwen3-Next-architecture model of runtime_smoke.sh (seeded random
# weights, SYNTHETIC decay values, horizons 313/125/63/21/6/2/0.8/0.4 tokens per head, not trained)
# from five servers started in parallel on one GPU, all compressed-only (every cached state is in the
# dasc pool, so every hit is a compressed hit):
#   dense     SGLang alone (reference outputs)
#   nr-w64    dasc-nr,  W_max=64 (2 of 8 heads kept per layer)
#   wr-w16    dasc-wr,  W_max=16 (4 kept), w_replay_cap 8
#   wr-w64    dasc-wr,  W_max=64 (2 kept), w_replay_cap 64, DASC_WR_CHECK=1 (device check of every pass)
#   wr-w128   dasc-wr,  W_max=128 (1 kept), w_replay_cap 128
# and runs benchmarks/h200/wr_smoke_client.py against each. Decode CUDA graphs on; prefill CUDA
# graphs off (start-up time). What it shows: the scratch pass runs inside SGLang on a GPU (batch
# log "dasc refreshed"), a hit whose window is the whole cached prefix reproduces Dense's output,
# the pass's own kept units against the restored checkpoint (DASC_WR_CHECK), and the 1-token latency
# of a compressed hit under nr and wr at W = 8 / 64 / 128.
#
# Carry .dev/sglang (site.tar.xz, run_sglang.sh) and .dev/wr (dasc wheel built from a known commit,
# snapshot copies of this script, the client and smoke_model.py), made by
# `bash benchmarks/h200/wr_prepare.sh [COMMIT]`, and run `bash .dev/wr/wr_smoke.sh` from the repo root.
set -uo pipefail
export OUT=${OUT:-/tmp/dasc-wr}
mkdir -p "$OUT"
DEV=.dev/sglang; WR=.dev/wr
T0=$(date +%s); DEADLINE=${WR_DEADLINE:-215}
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

stamp "setup"
if [ ! -f /tmp/site/.done ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf "$DEV/site.tar.xz" && touch /tmp/site/.done || { echo "unpack failed"; exit 3; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WR"/dasc-*.whl \
  > "$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 3; }
cd "$WR" || exit 3        # the snapshot's scripts, not the working tree's
python3 - <<'EOF' || exit 3
import json, sys
sys.argv = ["x"]
import smoke_model as sm
from dasc_compile.compiler import compile_plan
from dasc_compile.policy import Policy
sm.write_checkpoint("../sglang/qwen3next-tiny.config.json", "/tmp/tiny")
for w, pol in ((64, "nr"), (16, "wr"), (64, "wr"), (128, "wr")):
    plan, path = compile_plan("/tmp/tiny", Policy(w_max=w, load_policy=pol), f"/tmp/plan-{pol}-w{w}.dasc",
                              with_kernels=True)
    print(f"plan {path}: {pol} w_max={w} kept {plan.totals.n_kept}/{plan.totals.n_units} w_replay_cap "
          f"{plan.refresh.w_replay_cap} any_local {plan.refresh.any_local}")
EOF
COMMON=(--skip-tokenizer-init --mem-fraction-static 0.13 --context-length 4096 --disable-prefill-cuda-graph
        --max-running-requests 8 --log-level info)
NR=(--dasc-compressed-only --dasc-pool-slots 64)
WRF=("${NR[@]}" --dasc-refresh-slots 4)
start() {  # start LABEL PORT [flags...] in the background; its pid file appears when /health answers
  local label=$1 port=$2; shift 2
  ( pid=$(bash ../sglang/run_sglang.sh ../sglang/site.tar.xz /tmp/tiny "$port" "${COMMON[@]}" "$@") && echo "$pid" > "$OUT/pid_$label" ) &
}
stamp "start 5 servers"
start dense 31501
start nr-w64 31502 --dasc-plan /tmp/plan-nr-w64.dasc "${NR[@]}"
start wr-w16 31503 --dasc-plan /tmp/plan-wr-w16.dasc "${WRF[@]}"
( export DASC_WR_CHECK=1; start wr-w64 31504 --dasc-plan /tmp/plan-wr-w64.dasc "${WRF[@]}" )
start wr-w128 31505 --dasc-plan /tmp/plan-wr-w128.dasc "${WRF[@]}"
while :; do
  up=$(ls "$OUT"/pid_* 2>/dev/null | wc -l)
  [ "$up" -ge 5 ] && break
  [ $(( $(date +%s) - T0 )) -ge "$DEADLINE" ] && break
  sleep 3
done
stamp "servers up: $(ls "$OUT"/pid_* 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')"
python3 wr_smoke_client.py "$OUT/client.json" dense=31501 nr-w64=31502 wr-w16=31503 wr-w64=31504 wr-w128=31505
stamp "client done"
for f in "$OUT"/pid_*; do kill -TERM -- -"$(cat "$f")" 2>/dev/null; done
for port in 31501 31502 31503 31504 31505; do
  echo "--- server $port: dasc lines"
  grep -E "dasc-wr|dasc refreshed|refusing|Traceback|Error" "$OUT/server_$port.log" | cut -c1-400 | tail -6
done
stamp "end"
