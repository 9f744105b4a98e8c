#!/usr/bin/env bash
# Matched-memory serving benchmark on H200s (issue: serving benchmark; paper §5.3): Kimi-Linear-48B-A3B's
# real config with SGLang's dummy weights, plans compiled from the bundled reference checkpoint
# (decay values = initialisation draws, not trained weights: the compression each arm gets comes
# from those stand-in values), one SGLang 0.5.17 server per GPU group, arms run side by side.
#
# Run from the repo root on the device with .dev/sglang and .dev/dascwhl carried (make them with
# benchmarks/h200/prepare_carry.sh; the SGLang tarball already holds pydantic 2.14.4, so a carried
# .whl folder is optional and installed over it only when present):
#   PHASE=arms ARMS="dense int8 dasc-nr-w512 dasc-nr-w128" SEEDS="0 1 2" bash benchmarks/h200/serving_bench.sh
#   PHASE=tp TP=4 TRANSFER=before ARMS="dasc-nr-w128 dasc-nr-w128-storage" SEEDS="0" bash benchmarks/h200/serving_bench.sh
# Settings (env): DENSE_SLOTS (M, default 48), MRR (max running requests, 8; the non-Dense arms keep 5 * MRR
# native slots, SGLang's extra_buffer strategy, which every arm names),
# NCONV (conversations, 64), CONC (client concurrency, 64), CLIP (decode clip, 128), DEADLINE (s, 540),
# GPUS ("0 1 2 3"), TRANSFER=before|after (also run tp_transfer_bench at --tp $XTP, default $TP),
# GPUTEST=1 (first run the CUDA test of the runtime's stream-ordered reclamation wait; unless it
# passes, with no test skipped, every dasc arm runs with DASC_RECLAIM_WAIT=host: the driver prints
# so, and each arm's manifest entry records the DASC_* variables its server saw under "env").
# Arms may carry -hostwait (dasc arms): the same arm with DASC_RECLAIM_WAIT=host, for an A/B.
#   PHASE=rates bash benchmarks/h200/serving_bench.sh   (prefill / decode rates without pauses, GPU 0:
#       SGLang's own benchmark.one_batch at batch 1 and 8, inputs 2,048 and 8,192 tokens; not yet run on
#       the device)
# Results: $OUT/serving-$PHASE.tar.gz (manifest.json, per arm server.log and sSEED.json / .md).
set -uo pipefail
export OUT=${OUT:-/tmp/dasc-serving-out}; mkdir -p "$OUT"
PHASE=${PHASE:-arms}; TP=${TP:-1}; SEEDS=${SEEDS:-"0 1"}; GPUS=${GPUS:-"0 1 2 3"}
DENSE_SLOTS=${DENSE_SLOTS:-48}; MRR=${MRR:-8}
NCONV=${NCONV:-64}; CONC=${CONC:-64}; CLIP=${CLIP:-128}; DEADLINE=${DEADLINE:-540}
ARMS=${ARMS:-"dense int8 dasc-nr-w512 dasc-nr-w128 dasc-nr-w64 dasc-nr-w16 dasc-nr-w128-int8"}
TRACE=benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }

stamp "setup ($(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | tr -s ' '))"
if [ ! -f /tmp/site/.done ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf .dev/sglang/site.tar.xz && touch /tmp/site/.done || exit 3
fi
# (re)install the carried wheels whenever they differ from the ones installed on this (warm) machine
extra=(); if compgen -G ".whl/*.whl" > /dev/null; then extra=(.whl/*.whl); fi
WHEELS_SHA=$(cat "${extra[@]}" .dev/dascwhl/dasc-*.whl | sha256sum | cut -c1-16)
if [ "$(cat /tmp/site/.dasc 2>/dev/null)" != "$WHEELS_SHA" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${extra[@]}" .dev/dascwhl/dasc-*.whl > "$OUT/pip.log" 2>&1 && echo "$WHEELS_SHA" > /tmp/site/.dasc \
      || { cat "$OUT/pip.log"; exit 3; }
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/kimi && cp plans/reference/kimi-linear-48b-a3b/config.json /tmp/kimi/config.json

if [ "$PHASE" = rates ]; then
  stamp "one_batch rates"
  CUDA_VISIBLE_DEVICES=${GPUS%% *} timeout "${DEADLINE}" python3 -m sglang.benchmark.one_batch --model-path /tmp/kimi \
      --load-format dummy --attention-backend triton --sampling-backend pytorch --context-length 17408 \
      --max-running-requests 8 --batch-size 1 8 --input-len 2048 8192 --output-len 16 \
      --result-filename "$OUT/one_batch.jsonl" > "$OUT/one_batch.log" 2>&1
  echo "one_batch rc=$?"; grep -iE "prefill|decode|throughput|latency" "$OUT/one_batch.log" | tail -30
  stamp done; exit 0
fi

if [ "${GPUTEST:-0}" = 1 ]; then
  stamp "GPU test: stream-ordered reclamation wait"
  if ! python3 -c "import pytest" 2> /dev/null; then
    echo "gputest: not run (no pytest on this machine); dasc arms fall back to DASC_RECLAIM_WAIT=host"
    export DASC_RECLAIM_WAIT=host
  elif CUDA_VISIBLE_DEVICES=${GPUS%% *} timeout 180 python3 -m pytest -q -p no:cacheprovider -o addopts= \
      tests/test_runtime_tiers.py -k "stream_wait or order_after or reclaim_wait" > "$OUT/gputest.log" 2>&1 \
      && ! tail -1 "$OUT/gputest.log" | grep -qE "skipped|no tests ran"; then
    echo "gputest: passed ($(tail -1 "$OUT/gputest.log"))"
  else
    echo "gputest: FAILED or skipped, dasc arms fall back to DASC_RECLAIM_WAIT=host"; tail -30 "$OUT/gputest.log"
    export DASC_RECLAIM_WAIT=host
  fi
  [[ "${DASC_RECLAIM_WAIT:-}" == host && "$ARMS" == *-hostwait* ]] && \
    echo "gputest: WARNING: every arm now waits on the host, so the -hostwait A/B compares host with host"
fi

PLANS=/tmp/plans; mkdir -p $PLANS
compile() {  # compile W INT8 BALANCE
  local w=$1 i8=$2 bal=$3 name pol=()
  name="w$w$([ "$i8" = 1 ] && echo -int8)-tp$TP-$bal"
  [ -f "$PLANS/$name/plan.json" ] && return 0
  if [ "$i8" = 1 ]; then printf 'int8: true\n' > /tmp/int8.yaml; pol=(--policy /tmp/int8.yaml); fi
  python3 -m dasc_compile.cli compile plans/reference/kimi-linear-48b-a3b --wmax "$w" --tp "$TP" \
      --balance "$bal" "${pol[@]}" --out "$PLANS/$name" | tail -1 || exit 3
}
for arm in $ARMS; do
  case $arm in
    dense|int8) compile 128 0 off ;;
    dasc-nr-w*) w=${arm#dasc-nr-w}; w=${w%%-*}
                compile "$w" "$([[ $arm == *-int8* ]] && echo 1 || echo 0)" "$([[ $arm == *-storage* ]] && echo storage || echo off)" ;;
  esac
done
python3 -m benchmarks.serving_arms --plans $PLANS --tp "$TP" --dense-slots "$DENSE_SLOTS" \
    --max-running-requests "$MRR" --strategy extra_buffer --arms $ARMS --out /tmp/arms.json || exit 3

transfer() {  # storage balancing all-to-all on the GPUs (exactness + cost), P = $XTP
  stamp "tp_transfer_bench --tp $XTP"
  timeout "${XTIMEOUT:-240}" python3 -m benchmarks.tp_transfer_bench --tp "$XTP" --wmax 16 128 --n 1 8 64 \
      --out "$OUT/tp_transfer.md" --json "$OUT/tp_transfer.json" > "$OUT/tp_transfer.log" 2>&1
  echo "tp_transfer rc=$?"; tail -25 "$OUT/tp_transfer.log"
}
XTP=${XTP:-$TP}
[ "${TRANSFER:-none}" = before ] && transfer
stamp "arms: $ARMS (TP $TP, seeds $SEEDS)"
LEFT=$(( DEADLINE - ($(date +%s) - T0) ))
# keep room for the transfer benchmark and the tar of the results when they come after the arms
[ "${TRANSFER:-none}" = after ] && LEFT=$(( LEFT - ${XTIMEOUT:-240} - 20 ))
python3 -m benchmarks.run_serving --arms-json /tmp/arms.json --plans $PLANS --model /tmp/kimi \
    --gpus $GPUS --gpus-per-arm "$TP" --trace $TRACE --num-conversations "$NCONV" --decode-clip "$CLIP" \
    --concurrency "$CONC" --max-running-requests "$MRR" --vocab-size 163840 --seeds $SEEDS \
    --deadline-s "$LEFT" --work "/tmp/serving-$PHASE" 2>&1 | tee "$OUT/run.log"
cp /tmp/arms.json "/tmp/serving-$PHASE/arms.json"
[ "${TRANSFER:-none}" = after ] && transfer
tar -C /tmp -czf "$OUT/serving-$PHASE.tar.gz" "serving-$PHASE"
stamp done
