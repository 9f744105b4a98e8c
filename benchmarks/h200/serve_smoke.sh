#!/usr/bin/env bash
# H200: the chat client (benchmarks/chat_replay.py, served-reply replay, 8 clients) against real
# SGLang 0.5.17 servers, dense and --dasc-plan, on the 8-conversation smoke trace. A check that the
# trace, client and plugin work together end to end -- NOT the matched-memory serving benchmark (that
# needs a real-size model, several arms and seeds; see BENCHMARKS.md). Same model and setup as
# runtime_smoke.sh (tiny Qwen3-Next architecture, seeded random weights, synthetic decay values). Run
# from the repo root with .dev/sglang and .dev/dascwhl carried (benchmarks/h200/prepare_carry.sh):
#   bash benchmarks/h200/serve_smoke.sh
set -uo pipefail
export OUT=${OUT:-/tmp/dasc-serve-smoke}; mkdir -p "$OUT"
DEV=.dev/sglang
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
T0=$(date +%s); stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
stamp setup
source benchmarks/h200/site_env.sh && dasc_site "$DEV/site.tar.xz" "$OUT" || exit 3
python3 -m benchmarks.h200.smoke_model checkpoint "$DEV/qwen3next-tiny.config.json" /tmp/tiny > /dev/null || exit 3
python3 -m benchmarks.h200.smoke_model plan /tmp/tiny /tmp/plan-w16.dasc --wmax 16 || exit 3
TRACE=benchmarks/traces/sharegpt_qwen_n8_d64_s0.json.gz
COMMON=(--skip-tokenizer-init --mem-fraction-static 0.5 --context-length 16384 --disable-prefill-cuda-graph
        --max-running-requests 8 --log-level info)
arm() {  # arm PORT LABEL [flags]
  local port=$1 label=$2; shift 2
  stamp "$label: start $*"
  local pid; pid=$(bash "$DEV/run_sglang.sh" "$DEV/site.tar.xz" /tmp/tiny "$port" "${COMMON[@]}" "$@") || { echo "$label: no server"; return 1; }
  stamp "$label: up"
  timeout 120 python3 -E -s -S -m benchmarks.chat_replay --trace "$TRACE" --url "http://127.0.0.1:$port" --arm "$label" \
      --seed 0 --conversations-per-seed 8 --clients 8 --vocab-size 151936 --out "$OUT/$label.json.gz" 2>&1 | tail -12
  kill -TERM -- -"$pid" 2>/dev/null; sleep 4; kill -KILL -- -"$pid" 2>/dev/null
  grep -E "dasc hits" "$OUT/server_$port.log" | tail -1 | cut -c1-400
}
arm 30011 dense
arm 30012 dasc-nr-w16 --dasc-plan /tmp/plan-w16.dasc --dasc-pool-slots 64
stamp done
