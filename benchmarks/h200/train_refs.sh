#!/usr/bin/env bash
# One device call of reference-model training (issue 20 item 2, issue 23 item 4): the GDN hybrid (Qwen3-Next
# architecture), the KDA hybrid (Kimi-Linear architecture) and the Mamba2 hybrid (Nemotron-H architecture),
# those FAMILIES names, train side by side on the one GPU, each in its own process, until a shared deadline;
# each saves where it stopped and packs itself into $OUT.
#
# Here, on the CPU, before each call (benchmarks/train/prepare.py):
#   python -m benchmarks.train.prepare data                         # once: tokenizer + shards (.dev/train/prep)
#   python -m benchmarks.train.prepare stage [--returned DIR] [--families F ...] [--size S] [--check]
#     DIR: the last call's files (gdn.tzp.*, kda.tzp.*, mamba2.tzp.*); F: the families this call trains (their
#     checkpoints travel packed); S: their size (benchmarks/train/models.py SIZES, default ref; staged.json keeps
#     it and this script gives it to the trainers); --check prints the plan below and changes nothing
# What fits one call, measured 2026-12-03 by `prepare stage --check`, the tree again 2026-12-04 (stage refuses, in
# one line, a call over either limit). In, at most 64 MiB: the tree (~194 MiB unparked since the KDA m30 bundle;
# 25.5 after `python -m benchmarks.h200.park park bundles`; 10.8 after `park benchmarks/results` too, 4.6 after
# `park benchmarks/traces` as well, or all three at once: `park bundles benchmarks/results benchmarks/traces`:
# parked files do not travel, and no training call reads them) + wheels 2.7 (.dev/train/whl;
# `--also-carried` with no folder drops them, and the decay report with them) + tokenizer 0.7 + 2 of margin, then
# the packed checkpoints to resume with their training state (ref: gdn 14.6 / kda 15.7 / mamba2 15.9 MiB; m30:
# gdn 42.8 / kda 40.5 / mamba2 42.2 MiB, 3 parts), then data shards of ~2.6 MiB / 4.2M tokens (7, 27.8M tokens).
# Out, at most 8 files of <= 16 MiB and 64 MiB: run.log + summary.json + each family's 15 MiB parts.
#   ref, bundles parked: fresh starts of all three: 7 files, 48 MiB out; resuming two families: 1-2 shards
#     (both parked: 6-7); resuming one: all 7 shards; resuming all three: does not fit (stage refuses)
#   m30 (~30M parameters), ONE family per call (two return ~86-88 MiB in 8 files: stage refuses):
#     bundles, benchmarks/results and benchmarks/traces parked: resuming gdn 61.3 MiB in with 4 shards (16.8M
#     tokens); without the traces parked only 1 shard (4.2M tokens; kda or mamba2 2); out 5 files, ~44 MiB; a
#     fresh start carries all 7 shards; with only the bundles parked no m30 resume fits (66-69 MiB before any data)
# Device command (carry: .dev/train/call .dev/train/whl):
#   bash benchmarks/h200/train_refs.sh [BUDGET_S]     (default 570; give the call timeout_s >= BUDGET_S + 15:
#   a trainer still running at BUDGET_S - 10 gets SIGTERM (it saves), at BUDGET_S + 5 SIGKILL)
#   m30, one family (carry .dev/train/m30/call .dev/train/whl; staged with `prepare stage --call .dev/train/m30/call
#   --families gdn --size m30`): FAMILIES=gdn CALL=.dev/train/m30/call bash benchmarks/h200/train_refs.sh 570
# Environment: KERNELS=fla trains with flash-linear-attention's Triton ops (carried fla-core wheel; default
# torch: transformers' PyTorch GDN, benchmarks/train/kda_chunk.py for KDA); FLA_PROBE=0 skips the background
# probe of those ops (benchmarks/train/fla_probe.py, on by default when the wheel is carried, time-capped);
# SIZE (default: the staged one; another is refused) is the size the trainers build or resume at; CALL (default
# .dev/train/call) the staged folder, e.g. .dev/train/m30/call staged with `prepare stage --call .dev/train/m30/call`
# (its latest/ beside it: m30 checkpoints then never replace the ref ones in .dev/train/latest);
# FAMILIES="gdn kda" (default) picks the models, e.g. FAMILIES="mamba2" (it runs benchmarks/train/mamba2_chunk.py
# whatever KERNELS says); TRAIN_ARGS adds trainer flags to all; GDN_FLAGS, KDA_FLAGS, MAMBA2_FLAGS add trainer
# flags to that family's trainer only (after TRAIN_ARGS; unset: today's recipe), e.g. the long-range recall recipe
# for KDA, whose MLA layers stayed at uniform attention (benchmarks/train/recipe.py):
#   KDA_FLAGS="--recall-frac 0.5 --recall-min-gap 512 --copy-frac 0.25 --attn-lr-mult 3 --log-attn-entropy"
# or, for a recall stage with the rows' random stated values out of the loss (a resume of a bundle rebuilt by
# benchmarks/train/from_bundle.py: fresh AdamW, so a short warm-up), GDN_FLAGS="--stage-tokens 26e6 --recall-frac 0.5
#   --lr 5e-4 --warmup 50 --skip-source-loss --no-decay-report"
# or GDN_FLAGS="--no-rope --log-attn-entropy" (Qwen3-Next attention without rotary, the RoPE control; the same flags resume it;
#   stage it with `prepare stage --families gdn --fresh gdn`)
# or GDN_FLAGS="--no-attention --skip-source-loss --recall-frac 0.5" (every mixer recurrent: the retrieval control of
#   benchmarks/notes/2026-12-04-recurrent-only-control.md; staged as the RoPE control is)
# Each session records the recipe it ran with (state.json's session list, the start line of run.log).
# $OUT (at most 8 files): run.log (everything, each line tagged), summary.json (each model's last
# record), <family>.tzp.NN (packed checkpoints with their training state; the next stage carries them on).
set -uo pipefail
cd "$(dirname "$0")/../.."
T_START=$(date +%s)
BUDGET=${1:-570}
[[ "$BUDGET" =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge 30 ] || { echo "error: BUDGET_S '$BUDGET': expected whole seconds >= 30 (the trainers stop 20 s before it)" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "error: OUT: set it to the folder that comes back (the device tool's \$OUT)" >&2; exit 2; }
[ -d "$OUT" ] || { echo "error: OUT '$OUT': expected an existing folder (the device tool's \$OUT)" >&2; exit 2; }
STOP_AT=$((T_START + BUDGET - 20))   # trainers stop stepping save-reserve (20 s; train.py) before this
CALL=${CALL:-.dev/train/call}
WHL=.dev/train/whl
OUT=${OUT:?set OUT to the folder that comes back}
KERNELS=${KERNELS:-torch}
FAMILIES=${FAMILIES:-gdn kda}
for fam in $FAMILIES; do
  case $fam in gdn|kda|mamba2) ;; *) echo "error: FAMILIES has '$fam': expected gdn, kda or mamba2" >&2; exit 2;; esac
done
[ -n "${FAMILIES// }" ] || { echo "error: FAMILIES is empty: expected gdn, kda and/or mamba2" >&2; exit 2; }
case ${SIZE:-ref} in ref|m30|pilot|smoke) ;; *) echo "error: SIZE '$SIZE': expected ref, m30, pilot or smoke (benchmarks/train/models.py SIZES), or unset (the staged size)" >&2; exit 2;; esac
case $KERNELS in torch|fla) ;; *) echo "error: KERNELS '$KERNELS': expected torch or fla" >&2; exit 2;; esac
LOG=$OUT/run.log
say() { echo "[train_refs $(($(date +%s) - T_START))s] $*" | tee -a "$LOG"; }

say "budget ${BUDGET}s, stop at +$((STOP_AT - T_START))s, kernels $KERNELS, families: $FAMILIES"
# a family the call was not staged for would start fresh without a word, and its returned checkpoint
# would then replace the trained one as the newest (prepare stage --families records the staged ones)
STAGED=$(python3 -c "import json, sys; print(' '.join(json.load(open(sys.argv[1])).get('families', ['?'])))" \
  "$CALL/staged.json" 2>/dev/null || echo "?")
if [ "$STAGED" = "?" ]; then   # a typo in CALL, or a call staged before staged.json existed: nothing to check against
  say "error: CALL $CALL: no readable staged.json (run python -m benchmarks.train.prepare stage --call $CALL first)"
  exit 2
fi
for fam in $FAMILIES; do
  if [ "$STAGED" != "?" ] && ! [[ " $STAGED " == *" $fam "* ]]; then
    say "error: FAMILIES has $fam but the call was staged for: ${STAGED:-no family} (run prepare stage --families $FAMILIES)"
    exit 2
  fi
done
# the size the trainers build or resume at: staged.json's (prepare stage --size; ref when it names none)
STAGED_SIZE=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('size', 'ref'))" \
  "$CALL/staged.json" 2>/dev/null || echo "?")
if [ "$STAGED_SIZE" = "?" ]; then SIZE=${SIZE:-ref}; else SIZE=${SIZE:-$STAGED_SIZE}; fi
if [ "$STAGED_SIZE" != "?" ] && [ "$SIZE" != "$STAGED_SIZE" ]; then
  say "error: SIZE is $SIZE but the call was staged for --size $STAGED_SIZE (run prepare stage --size $SIZE)"
  exit 2
fi
say "size $SIZE"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
# dasc's compiler (the decay report) needs pydantic, which the image lacks; fla only when asked for
# Wheels and the unpacked checkpoints go to a folder of this call's own: a warm machine keeps the last call's
# /tmp, where a fresh start would otherwise find (and resume) the last call's checkpoint
SCRATCH=$(mktemp -d /tmp/train_refs.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT   # by then the trainers have packed their checkpoints into $OUT
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SCRATCH/site \
  $WHL/pydantic-*.whl $WHL/pydantic_core-*.whl $WHL/annotated_types-*.whl $WHL/typing_inspection-*.whl 2>&1 \
  | tee -a "$LOG"; then
  # a fresh start draws its decays with dasc's compiler, which imports pydantic: without it the trainer would
  # stop at model build with a traceback (prepare stage refuses to stage one; this catches a hand-made call)
  FRESH=$(python3 -c "import json, sys; print(' '.join(json.load(open(sys.argv[1])).get('fresh', [])))" \
    "$CALL/staged.json" 2>/dev/null)
  if [ -n "$FRESH" ]; then
    say "error: $WHL: no pydantic wheels, and $FRESH start(s) fresh, whose decay initialisation needs them: carry $WHL (benchmarks/h200/README.md, training step 1)"
    exit 2
  fi
  say "pydantic wheels missing: the decay report will be skipped"
fi
FLA_WHEEL=$(ls $WHL/fla_core-*.whl 2>/dev/null | head -1)
if [ -n "$FLA_WHEEL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SCRATCH/fla "$FLA_WHEEL" 2>&1 | tee -a "$LOG"
fi
export PYTHONPATH=$SCRATCH/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export DASC_COMMIT=$(cat $CALL/commit.txt 2>/dev/null || echo unknown)
if [ "$KERNELS" = fla ]; then export PYTHONPATH=$SCRATCH/fla:$PYTHONPATH; fi
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$LOG"
say "commit $DASC_COMMIT; data: $(cat $CALL/staged.json 2>/dev/null | tr -d '\n ')"
if ls $CALL/resume/*.tzp.* >/dev/null 2>&1; then
  python3 -m benchmarks.train.pack $CALL/resume $SCRATCH/resume 2>&1 | tee -a "$LOG"
fi

n=$(echo $FAMILIES | wc -w)
FRACTION=$(python3 -c "print(round(0.92 / $n, 2))")
pids=()
for fam in $FAMILIES; do
  resume=()
  if [ -f "$SCRATCH/resume/$fam/config.json" ]; then resume=(--resume "$SCRATCH/resume/$fam"); fi
  flags_var="${fam^^}_FLAGS"            # GDN_FLAGS, KDA_FLAGS, MAMBA2_FLAGS
  fam_flags=${!flags_var:-}
  say "$fam: ${resume[*]:-fresh start}${fam_flags:+; $flags_var: $fam_flags}"
  { timeout -k 15 $((STOP_AT - $(date +%s) + 10)) python3 -m benchmarks.train.train --family $fam --data $CALL \
      --out $SCRATCH/refs --stop-at $STOP_AT --pack-to "$OUT" --memory-fraction $FRACTION --size "$SIZE" "${resume[@]}" \
      ${TRAIN_ARGS:-} $fam_flags; \
    echo $? > $SCRATCH/rc-$fam; } 2>&1 | sed -u "s/^/[$fam] /" >> "$LOG" &
  pids+=($!)
done
if [ -n "$FLA_WHEEL" ] && [ "${FLA_PROBE:-1}" = 1 ] && [ "$KERNELS" != fla ]; then
  cap=$((STOP_AT - $(date +%s) - 90))
  if [ $cap -gt 60 ]; then
    cap=$((cap < 300 ? cap : 300))
    say "fla probe in the background (at most ${cap}s)"
    (timeout -k 5 $cap python3 -m benchmarks.train.fla_probe --fla $SCRATCH/fla 2>&1 | sed -u "s/^/[fla] /" >> "$LOG"; \
     echo "[fla] probe ended (exit ${PIPESTATUS[0]}: 124 = time cap reached)" >> "$LOG") &
  fi
fi
for p in "${pids[@]}"; do wait "$p"; done
rc=0
for fam in $FAMILIES; do
  r=$(cat $SCRATCH/rc-$fam 2>/dev/null || echo missing); say "$fam trainer exit: $r"; [ "$r" = 0 ] || rc=1
done
python3 -m benchmarks.train.scoring "$LOG" --write-summary "$OUT/summary.json" || say "summary.json not written"
say "done; files: $(ls $OUT | tr '\n' ' ')"
exit $rc
