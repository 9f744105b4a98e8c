#!/usr/bin/env bash
# Serving protocols A (closed loop) and B (open loop) of issue 24 on ONE H200, from the repo root of a
# device call. Every arm's SGLang server stays resident across device calls while the machine is warm
# (benchmarks/run_chat.py starts them in their own sessions): the first call pays the start-up, later
# calls go straight to measuring. Each call measures trace seeds x arms in a balanced order with Dense
# first and, on the call's first seed, last (drift).
#
# Model: Kimi-Linear-48B-A3B's config with SGLang's dummy weights and NUM_EXPERTS routed experts (16
# of 256; 8 active per token as in the real model: per-layer state shapes and active compute per token
# unchanged, weights ~10 GB so six servers fit on one GPU). Decays: the calibrated reference
# (synthetic, calibrated to published statistics; not trained weights).
#
# Carried (git-ignored), made on a CPU machine by
#   REFRESH_SLOTS=2 bash benchmarks/h200/prepare_serving.sh HEAD
#   .dev/sglang/site.tar.xz   SGLang 0.5.17 (benchmarks/h200/prepare_carry.sh)
#   .dev/dascwhl/dasc-*.whl   dasc (the runtime plugin)
#   .dev/ol/plans.tar.xz      plans w16, w16+INT8, w64, w16 dasc-wr and arms.json (DENSE_SLOTS 56, MRR 8)
#   .dev/jit/jit.tar.xz       optional: the compile caches a previous call returned (site_env.sh jit_save), which
#                             cut a fresh machine's server start; carry .dev/jit (park benchmarks/results for room)
# Run (device, repo root): bash benchmarks/h200/chat_bench.sh
# Settings (env): ARMS (the arms; each seed orders them by its Williams-design row; default "dense int8 dasc-nr-w16 dasc-nr-w64 dasc-nr-w16-int8 dasc-wr-w16"),
#   UP_ARMS (the servers to have up, default ARMS: a superset starts now the servers a later call of other ARMS
#   will measure, e.g. protocol B's, whose runs leave no room for a start in the call),
#   BASELINE (dense: the arm that opens the call's first seed and closes the call, so its drift is measured; one of ARMS),
#   SEEDS ("0"), PER_SEED (24 conversations), CLIENTS (24), MRR (8), CLIP (256), PAD (0: context pad tokens),
#   SHARED (0: the first SHARED tokens of the pad are the same in every conversation of a seed, a shared system prompt;
#   PAD - 2 or more shares the whole pad, and seeds holding near-duplicate conversations are then refused),
#   REPLAY (served-reply), RATE (unset: closed loop; else open loop at RATE conversations/s with THINK s),
#   TRACE (default the long-prompt trace), CONTEXT (24576), DEADLINE (s from the script's start, 570),
#   FIRST_RUN_S (60: what a closed-loop run is assumed to take until one has run in this call; a seed starts only
#   when all its arms and the closing baseline fit; an open-loop run (RATE) is assumed to take its seed's span from
#   the arrival and think-time schedule, benchmarks/chat_replay.py open_loop_span_s, and FIRST_RUN_S is not used),
#   EXPECT_S ("ARM=S ...": a closed-loop run's estimate for ARM until it has run in this call, e.g. "dasc-nr-w16=60"
#   from an earlier call at the same PAD: without it an arm not yet run is reserved at the longest run so far),
#   LAUNCHER + PYTHON (a CPU rehearsal: LAUNCHER="$PWD/.venv/bin/python $PWD/tests/support/fake_sglang_server.py"),
#   CHAT_WORK (the work folder, /tmp/chat: servers.json, runs/, the unpacked plans; kept across calls; chat.tar.gz
#   holds it under its own name), BASE_PORT (30100: arm i of UP_ARMS listens on BASE_PORT + 10 i, NCCL on
#   BASE_PORT + 1000 + 10 i), OUT (/tmp/chat-out: the results below),
#   NUM_EXPERTS (16), MAX_TOTAL_TOKENS (each server's KV cap, 600000: above a seed's working set), DOWN (1: stop the servers at the end,
#   unless no run began in the call or its run settings were refused; 0 keeps them for the next call; run settings
#   the trace or the plans cannot serve (a seed it lacks, a baseline not among ARMS, an arm arms.json lacks, a turn
#   over CONTEXT) are refused before any server starts, exit status 2),
#   SERVER_FLAGS (more SGLang flags for every server, each as --flag=value, e.g. "--mamba-track-interval=64"; only
#   servers this call starts get them: stop resident ones first, DOWN=1).
# Results in $OUT: chat.tar.gz (the work folder: servers.json, manifest.json, runs/, server logs gzipped), run.log
# (appended to: each invocation of one device call adds its part),
# jit.tar.xz (the compile caches, when they pack within 15 MiB).
set -uo pipefail
T0=$(date +%s)
CARRY=$PWD; W=$(realpath -m -- "${CHAT_WORK:-/tmp/chat}")   # absolute: each server runs in its own folder under it
ARMS=${ARMS:-"dense int8 dasc-nr-w16 dasc-nr-w64 dasc-nr-w16-int8 dasc-wr-w16"}
UP_ARMS=$(echo ${UP_ARMS:-$ARMS})      # words, one space apart (tabs and newlines split as in ARMS)
for arm in $ARMS; do
  case " $UP_ARMS " in *" $arm "*) ;; *) echo "error: UP_ARMS '$UP_ARMS' lacks '$arm' of ARMS: expected every measured arm among the servers to start" >&2; exit 2;; esac
done
export OUT=${OUT:-/tmp/chat-out}; mkdir -p "$OUT"
SEEDS=${SEEDS:-0}; PER_SEED=${PER_SEED:-24}; CLIENTS=${CLIENTS:-24}; MRR=${MRR:-8}; CLIP=${CLIP:-256}
PAD=${PAD:-0}; SHARED=${SHARED:-0}; REPLAY=${REPLAY:-served-reply}; CONTEXT=${CONTEXT:-24576}; DEADLINE=${DEADLINE:-570}
NUM_EXPERTS=${NUM_EXPERTS:-16}; DOWN=${DOWN:-1}; MAX_TOTAL_TOKENS=${MAX_TOTAL_TOKENS:-600000}; BASELINE=${BASELINE:-dense}
TRACE=${TRACE:-benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_s0.json.gz}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
{
echo "=== chat_bench $(date -u '+%F %T') UTC: ARMS='$ARMS' SEEDS='$SEEDS' PAD=$PAD SHARED=$SHARED CLIENTS=$CLIENTS BASELINE=$BASELINE${RATE:+ RATE=$RATE} (run.log: one such line per invocation)"
stamp "setup ($(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || echo no GPU))"
launcher=(); PY=python3
if [ -n "${LAUNCHER:-}" ]; then launcher=(--launcher "$LAUNCHER"); PY=${PYTHON:-python3}   # CPU rehearsal
else
  source benchmarks/h200/site_env.sh && dasc_site "$CARRY/.dev/sglang/site.tar.xz" "$OUT" || exit 3
  jit_restore "$CARRY/.dev/jit"
fi
mkdir -p "$W/plans" "$W/kimi"
if [ ! -f "$W/plans/arms.json" ] && [ ! -f "$CARRY/.dev/ol/plans.tar.xz" ]; then
  echo "error: $CARRY/.dev/ol/plans.tar.xz: no such file (the plans and arms.json; build it with bash benchmarks/h200/prepare_serving.sh)"
  exit 2
fi
[ -f "$W/plans/arms.json" ] || tar -xJf "$CARRY/.dev/ol/plans.tar.xz" -C "$W/plans" || exit 3
"$PY" - plans/reference/kimi-linear-48b-a3b-calibrated/config.json "$W/kimi/config.json" "$NUM_EXPERTS" <<'EOF' || exit 3
import json, sys
cfg = json.load(open(sys.argv[1])); cfg["num_experts"] = int(sys.argv[3])
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
EOF
extra=(); for f in ${SERVER_FLAGS:-}; do extra+=("--server-flag=$f"); done
expect=(); for e in ${EXPECT_S:-}; do expect+=("--expect-s=$e"); done
mode=(--clients "$CLIENTS"); [ -n "${RATE:-}" ] && mode=(--rate "$RATE" --think-s "${THINK:-0}")
runargs=(--work "$W" --trace "$TRACE" --arms $ARMS --seeds $SEEDS --baseline "$BASELINE" --conversations-per-seed "$PER_SEED"
         "${mode[@]}" --decode-clip "$CLIP" --pad-tokens "$PAD" --shared-prefix-tokens "$SHARED" --replay "$REPLAY" --context-length "$CONTEXT" --first-run-s "${FIRST_RUN_S:-60}" "${expect[@]}")
# run_chat's refusals name its flags; the settings of this script that set them (keep beside runargs)
flags_are="--work CHAT_WORK, --trace TRACE, --arms ARMS, --seeds SEEDS, --baseline BASELINE, --conversations-per-seed PER_SEED,"
flags_are+=" --clients CLIENTS, --rate RATE, --think-s THINK, --decode-clip CLIP, --pad-tokens PAD, --shared-prefix-tokens SHARED, --replay REPLAY,"
flags_are+=" --context-length CONTEXT, --first-run-s FIRST_RUN_S, --expect-s EXPECT_S, --arms-json the plans' arms.json"
# the run settings against the trace before any server starts (a fresh machine's start costs ~200 s)
"$PY" -m benchmarks.run_chat run --check --arms-json "$W/plans/arms.json" "${runargs[@]}"; rc=$?
[ $rc -eq 0 ] || { stamp "run settings refused (above) before any server starts; servers already up are left up (the flags named are these settings: $flags_are)"; exit $rc; }
stamp "up: $UP_ARMS"
"$PY" -m benchmarks.run_chat up "${launcher[@]}" --arms-json "$W/plans/arms.json" --plans "$W/plans" --model "$W/kimi" \
    --arms $UP_ARMS --max-running-requests "$MRR" --context-length "$CONTEXT" --max-total-tokens "$MAX_TOTAL_TOKENS" --work "$W" \
    --base-port "${BASE_PORT:-30100}" "${extra[@]}"
rc=$?; [ $rc -eq 2 ] && { stamp "run_chat up refused its settings (above); servers already up are left up"; exit 2; }
stamp "servers: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null || echo 'GPU memory not read (no nvidia-smi)')"
LEFT=$(( DEADLINE - ($(date +%s) - T0) - 25 ))
stamp "run: seeds $SEEDS, $PER_SEED conversations each, ${mode[*]}, clip $CLIP, pad $PAD (shared $SHARED), $REPLAY; $LEFT s left"
if [ "$LEFT" -gt 0 ]; then
  "$PY" -m benchmarks.run_chat run "${runargs[@]}" --deadline-s "$LEFT"
  ran=$?      # 4: no run began (benchmarks/run_chat.py NOTHING_RAN); 2: the run's settings were refused before any run
else
  ran=4; stamp "no time left for a run (DEADLINE $DEADLINE s)"
fi
if [ "$DOWN" = 1 ] && [ $ran -eq 4 ]; then
  stamp "DOWN=1 not applied: no run began in this call, so the servers stay up for the next one (raise DEADLINE or lower FIRST_RUN_S; stop them: $PY -m benchmarks.run_chat down --work $W)"
elif [ "$DOWN" = 1 ] && [ $ran -eq 2 ]; then   # what --check cannot see; session 44 lost warm servers to a refusal
  stamp "DOWN=1 not applied: run_chat run refused the call (above) before any run, so the servers stay up for a corrected call (stop them: $PY -m benchmarks.run_chat down --work $W)"
elif [ "$DOWN" = 1 ]; then
  "$PY" -m benchmarks.run_chat down --work "$W"
fi
for f in "$W"/*/server.log; do [ -f "$f" ] && gzip -c "$f" > "$f.gz"; done
b=$(basename "$W")      # --anchored: only the work folder's own plans/ and kimi/, whatever its name
tar -C "$(dirname "$W")" -czf "$OUT/chat.tar.gz" --exclude=server.log --anchored --exclude="$b/plans" --exclude="$b/kimi" "$b"
[ -z "${LAUNCHER:-}" ] && jit_save "$OUT"
stamp done
if [ $ran -eq 2 ]; then exit 2; fi    # run_chat refused the call's run settings (the servers stay up)
} 2>&1 | tee -a "$OUT/run.log"   # -a: a second invocation in one device call adds to the log (session 42 lost one)
