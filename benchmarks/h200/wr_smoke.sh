#!/usr/bin/env bash
# dasc-wr on an H200, in ONE device call of <= 330 s (recipe: benchmarks/h200/README.md; issue 15 checks a-c).
#
# SGLang 0.5.17 serves the tiny Qwen3-Next-architecture model of runtime_smoke.sh (seeded random
# weights, SYNTHETIC decay values, horizons 313/125/63/21/6/2/0.8/0.4 tokens per head, not trained)
# from six servers on one GPU, all compressed-only (every cached state is in the dasc pool, so every
# hit is a compressed hit):
#   dense     SGLang alone (reference outputs)
#   nr-w64    dasc-nr,  W_max=64 (12 of 48 heads kept)
#   wr-keep   dasc-wr,  W_max=0: nothing omitted, so W_replay = 0 and the refresh is skipped (check a)
#   wr-w16    dasc-wr,  W_max=16 (24 kept), w_replay_cap 8
#   wr-w64    dasc-wr,  W_max=64 (12 kept), w_replay_cap 64
#   wr-w128   dasc-wr,  W_max=128 (6 kept), w_replay_cap 128
# The three wr servers that omit units run with DASC_WR_DUMP (their first passes' refreshed states
# are written for benchmarks/wr_reference_check.py, which replays the windows in PyTorch on a CPU:
# check b and the agreement with `dasc eval`). Every server gets the same memory flags: a high
# --mem-fraction-static with explicit caps on the KV pool (--max-total-tokens) and the native Mamba
# pool (--max-mamba-cache-size), so servers started side by side do not see each other's memory as
# missing (SGLang sizes pools from free memory minus (1 - fraction) of the total; the 0.13 each of the
# first smoke left two of five servers with a negative Mamba budget). Servers start 4 s apart.
# Decode CUDA graphs on; prefill CUDA graphs off (start-up time).
# Client: benchmarks/h200/wr_smoke_client.py (short-prompt outputs, the logprobs of a hit for the
# agreement check, 1-token latency of compressed hits at W = 8 / 64 / 128 against nr and Dense).
#
# Carry .dev/sglang (site.tar.xz, run_sglang.sh) and .dev/wr (dasc wheel built from a known commit,
# snapshot copies of this script, the client and smoke_model.py), made by
# `bash benchmarks/h200/wr_prepare.sh [COMMIT]`, and run `bash .dev/wr/wr_smoke.sh` from the repo root.
# $OUT gets (at most 8 files come back): client.json, plans.txt, dumps-wr-w<W>.tar.gz, logs.tar.gz.
set -uo pipefail
export OUT=${OUT:-/tmp/dasc-wr}
mkdir -p "$OUT"
DEV=.dev/sglang; WR=.dev/wr
T0=$(date +%s); DEADLINE=${WR_DEADLINE:-240}
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
LOGS=/tmp/wr-logs; DUMPS=/tmp/wr-dumps; PIDS=/tmp/wr-pids; rm -rf "$LOGS" "$DUMPS" "$PIDS"; mkdir -p "$LOGS" "$DUMPS" "$PIDS"

stamp "setup"
if [ ! -f /tmp/site/.done ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf "$DEV/site.tar.xz" && touch /tmp/site/.done || { echo "unpack failed"; exit 3; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WR"/dasc-*.whl \
  > "$LOGS/pip.log" 2>&1 || { tail -20 "$LOGS/pip.log"; exit 3; }
cd "$WR" || exit 3        # the snapshot's scripts, not the working tree's
python3 - "$OUT/plans.txt" <<'EOF' || exit 3
import sys
out = sys.argv[1]
sys.argv = ["x"]
import smoke_model as sm
from dasc_compile.compiler import compile_plan
from dasc_compile.policy import Policy
sm.write_checkpoint("../sglang/qwen3next-tiny.config.json", "/tmp/tiny")
lines = []
for w, pol in ((64, "nr"), (0, "wr"), (16, "wr"), (64, "wr"), (128, "wr")):
    plan, path = compile_plan("/tmp/tiny", Policy(w_max=w, load_policy=pol), f"/tmp/plan-{pol}-w{w}.dasc",
                              with_kernels=True)
    lines.append(f"plan {path}: {pol} w_max={w} kept {plan.totals.n_kept}/{plan.totals.n_units} w_replay_cap "
                 f"{plan.refresh.w_replay_cap} any_local {plan.refresh.any_local} content_hash {plan.content_hash} "
                 f"decay_sha256 {plan.fingerprint.decay_sha256} kept_units {[list(lp.kept_units) for lp in plan.layers]}")
print("\n".join(lines))
open(out, "w").write("\n".join(lines) + "\n")
EOF
COMMON=(--skip-tokenizer-init --mem-fraction-static 0.85 --max-total-tokens 65536 --max-mamba-cache-size 48
        --context-length 4096 --disable-prefill-cuda-graph --max-running-requests 8 --cuda-graph-max-bs 8
        --mamba-radix-cache-strategy extra_buffer --log-level info)
NR=(--dasc-compressed-only --dasc-pool-slots 64)
WRF=("${NR[@]}" --dasc-refresh-slots 4)
start() {  # start LABEL PORT [flags...] in the background; its pid file appears when /health answers
  local label=$1 port=$2; shift 2
  ( pid=$(OUT=$LOGS bash ../sglang/run_sglang.sh ../sglang/site.tar.xz /tmp/tiny "$port" "${COMMON[@]}" "$@") \
      && echo "$pid" > "$PIDS/pid_$label" ) &
}
stamp "start 6 servers, 4 s apart"
start dense 31501;                                                          sleep 4
start nr-w64 31502 --dasc-plan /tmp/plan-nr-w64.dasc "${NR[@]}";           sleep 4
start wr-keep 31503 --dasc-plan /tmp/plan-wr-w0.dasc "${NR[@]}";  sleep 4   # no --dasc-refresh-slots: refused for a plan that runs no refresh
for w in 16 64 128; do
  ( export DASC_WR_DUMP=$DUMPS/wr-w$w DASC_WR_DUMP_MAX=4
    start wr-w$w $((31500 + 4 + (w == 64) + 2 * (w == 128))) --dasc-plan /tmp/plan-wr-w$w.dasc "${WRF[@]}" )
  sleep 4
done
while :; do
  up=$(ls "$PIDS"/pid_* 2>/dev/null | wc -l)
  [ "$up" -ge 6 ] && break
  [ $(( $(date +%s) - T0 )) -ge "$DEADLINE" ] && break
  sleep 3
done
stamp "servers up: $(ls "$PIDS"/pid_* 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')"
python3 wr_smoke_client.py "$OUT/client.json" dense=31501 nr-w64=31502 wr-keep=31503 wr-w16=31504 wr-w64=31505 \
    wr-w128=31506
stamp "client done"
for f in "$PIDS"/pid_*; do kill -TERM -- -"$(cat "$f")" 2>/dev/null; done
for port in 31501 31502 31503 31504 31505 31506; do
  echo "--- server $port: dasc lines"
  grep -E "dasc-wr|dasc refreshed|refusing|Traceback|Error|error:" "$LOGS/server_$port.log" | cut -c1-400 | tail -8
done
for w in 16 64 128; do
  [ -d "$DUMPS/wr-w$w" ] && tar -C "$DUMPS" -czf "$OUT/dumps-wr-w$w.tar.gz" "wr-w$w"
done
tar -C "$LOGS" -czf "$OUT/logs.tar.gz" .
ls -la "$OUT"
stamp "end"
