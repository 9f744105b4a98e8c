#!/usr/bin/env bash
# One device call of issue 20's MQAR probe at the control's size: recurrent-only GDN models learn multi-query
# associative recall (benchmarks/train/mqar_probe.py) side by side on the one GPU until a shared deadline; then
# every run whose held-out accuracy passed the binding rule of the recurrent-only note is scored under dasc-nr,
# dasc-wr, init-horizon and Random masks (benchmarks/train/mqar_masks.py --device) before the call ends.
# The plan this serves: benchmarks/notes/2026-12-04-recurrent-only-control.md, "Next: MQAR at 33.9M".
#
# Device command (carry .dev/train/whl: the pydantic wheels dasc's compiler needs; first
# `python -m benchmarks.h200.park park bundles benchmarks/results`: this call reads neither, and the tree must fit
# the 64 MiB a call carries; `park restore` after):
#   bash benchmarks/h200/mqar_call.sh [BUDGET_S]      (default 570; give the call timeout_s >= BUDGET_S + 15)
# Environment:
#   SIZE (m30)         the model size (benchmarks/train/models.py SIZES), every mixer GDN
#   RUNS ("8:48 16:320")  the task shapes trained side by side, PAIRS:GAP each (gap = filler tokens between the
#                      records and the queries, so the distance a value must cross the state checkpoint)
#   KEYS, VALUES, VOCAB (256, 256, 1024), BATCH (32), LR (2e-3), SEED (0), LOG_EVERY (250)
#   TRAIN_S (0.62)     the share of the budget the probes train; the rest scores masks
#   WMAX_<PAIRS>_<GAP> the w_max values the masks run at for that shape (default: 8 16 32 when GAP <= 64,
#                      else 16 64 128 256, all below the default gap of 320)
#   ROWS (512)         held-out rows the masks score; DEVICE (cuda; cpu for a CPU rehearsal with SIZE=smoke)
#   MASKS (bound)      bound: masks only on the runs that bind; all: on every run (a rehearsal of the masks step)
#   The masks need transformers >= 5.17 (a model without attention layers); a CPU rehearsal runs with that python
#   first on PATH, e.g. PATH=$PWD/.venv-newest/bin:$PATH (bash scripts/setup_env.sh .venv-newest --newest).
# Exit status: 2 for a bad setting (one line, before any work); 1 when a probe or a masks step failed or was cut
# (run.log says which); 0 otherwise, whether or not a run bound.
# $OUT (an empty folder; a relative path is taken from the caller's folder): run.log, and per shape p<PAIRS>-g<GAP>.json (the probe's record, its log included) and
# masks-p<PAIRS>-g<GAP>.json (when it bound) or a line in run.log saying why no masks ran. The models are not
# returned and are deleted when the script ends (fp32, ~136 MB at m30): the commands are seeded, and the masks are
# scored here, in the same call.
set -uo pipefail
T_START=$(date +%s)
BUDGET=${1:-570}
bad() { echo "error: $*" >&2; exit 2; }
[ $# -le 1 ] || bad "expected at most one argument, BUDGET_S; got $#: $*"
[[ "$BUDGET" =~ ^[1-9][0-9]{1,5}$ ]] && [ "$BUDGET" -ge 60 ] || bad "BUDGET_S '$BUDGET': expected whole seconds, 60 to 999999"
[ -n "${OUT:-}" ] && [ -d "$OUT" ] || bad "OUT '${OUT:-}': expected an existing folder (the device tool's \$OUT)"
OUT=$(cd "$OUT" && pwd)                 # as given, from the caller's folder
for f in "$OUT"/run.log "$OUT"/p*-g*.json "$OUT"/masks-*.json; do
  [ -e "$f" ] && bad "OUT $OUT: holds an earlier call's files ($(basename "$f"), ...): give an empty folder"
done
cd "$(dirname "$0")/../.."
SIZE=${SIZE:-m30}; RUNS=${RUNS:-"8:48 16:320"}; DEVICE=${DEVICE:-cuda}
KEYS=${KEYS:-256}; VALUES=${VALUES:-256}; VOCAB=${VOCAB:-1024}; BATCH=${BATCH:-32}; LR=${LR:-2e-3}; SEED=${SEED:-0}
LOG_EVERY=${LOG_EVERY:-250}; ROWS=${ROWS:-512}; TRAIN_S=${TRAIN_S:-0.62}; MASKS=${MASKS:-bound}
case $MASKS in bound|all) ;; *) bad "MASKS '$MASKS': expected bound or all";; esac
case $SIZE in ref|m30|pilot|smoke) ;; *) bad "SIZE '$SIZE': expected ref, m30, pilot or smoke (benchmarks/train/models.py SIZES)";; esac
for v in KEYS VALUES VOCAB BATCH LOG_EVERY ROWS; do
  [[ "${!v}" =~ ^[1-9][0-9]{0,6}$ ]] || bad "$v '${!v}': expected a whole number >= 1"
done
[[ "$SEED" =~ ^[0-9]{1,9}$ ]] || bad "SEED '$SEED': expected a whole number >= 0"
[[ "$LR" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?$ ]] \
  && python3 -c "import sys; sys.exit(not 0 < float('$LR') < 1)" 2>/dev/null \
  || bad "LR '$LR': expected a learning rate in (0, 1), e.g. 2e-3"
[[ "$DEVICE" =~ ^(cpu|cuda|cuda:[0-9]{1,2})$ ]] || bad "DEVICE '$DEVICE': expected cuda, cuda:N or cpu"
[ -n "${RUNS// }" ] || bad "RUNS is empty: expected PAIRS:GAP shapes, e.g. \"8:48 16:320\""
seen=" "
for r in $RUNS; do
  [[ "$r" =~ ^[1-9][0-9]{0,4}:[0-9]{1,5}$ ]] || bad "RUNS has '$r': expected PAIRS:GAP (PAIRS >= 1), e.g. 16:320"
  [[ "$seen" == *" $((10#${r%:*})):$((10#${r#*:})) "* ]] && bad "RUNS has the shape $r twice: give each shape once"
  seen="$seen$((10#${r%:*})):$((10#${r#*:})) "
  [ "${r%:*}" -le "$KEYS" ] || bad "RUNS has '$r': ${r%:*} pairs, more than KEYS $KEYS"
  var=WMAX_${r%:*}_${r#*:}
  [ -z "${!var:-}" ] || [[ "${!var}" =~ ^[1-9][0-9]*( [1-9][0-9]*)*$ ]] || bad "$var '${!var}': expected w_max values separated by spaces, e.g. \"16 64\""
done
[ $((4 + KEYS + VALUES)) -lt "$VOCAB" ] || bad "VOCAB $VOCAB: expected more than 4 + KEYS + VALUES ($((4 + KEYS + VALUES))), the rest being fillers"
[[ "$TRAIN_S" =~ ^0\.[0-9]+$ ]] && python3 -c "import sys; sys.exit(not 0.1 <= float('$TRAIN_S') < 1)" 2>/dev/null \
  || bad "TRAIN_S '$TRAIN_S': expected the share of the budget the probes train, in [0.1, 1), e.g. 0.62"
LOG=$OUT/run.log
say() { echo "[mqar_call $(($(date +%s) - T_START))s] $*" | tee -a "$LOG"; }
SCRATCH=$(mktemp -d /tmp/mqar_call.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
WHL=.dev/train/whl
if ls $WHL/pydantic-*.whl > /dev/null 2>&1 && ! python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target $SCRATCH/site $WHL/pydantic-*.whl $WHL/pydantic_core-*.whl $WHL/annotated_types-*.whl \
    $WHL/typing_inspection-*.whl > $SCRATCH/pip.log 2>&1; then
  echo "[mqar_call] $WHL: its wheels do not install with this python ($(tail -1 $SCRATCH/pip.log)); using the installed pydantic, if any" >> "$LOG"
fi
export PYTHONPATH=$SCRATCH/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import pydantic" 2>/dev/null || { say "error: no pydantic (dasc's compiler needs it): carry $WHL (benchmarks/h200/README.md, training step 1)"; exit 2; }
say "budget ${BUDGET}s, size $SIZE, runs: $RUNS, device $DEVICE; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU)"
STOP=$(python3 -c "print(int($T_START + $BUDGET * $TRAIN_S))")
pids=()
for r in $RUNS; do
  p=${r%:*}; g=${r#*:}; tag=p$p-g$g
  ( python3 -m benchmarks.train.mqar_probe --device "$DEVICE" --size "$SIZE" --pairs "$p" --gap "$g" --keys "$KEYS" \
      --values "$VALUES" --vocab "$VOCAB" --batch "$BATCH" --lr "$LR" --seed "$SEED" --steps 1000000 \
      --log-every "$LOG_EVERY" --stop-at "$STOP" --out "$OUT/$tag.json" --save "$SCRATCH/$tag" 2>&1 \
      | sed -u "s/^/[$tag] /" >> "$LOG"; exit "${PIPESTATUS[0]}" ) &
  pids+=($!)
done
failed=0
i=0
for r in $RUNS; do
  wait "${pids[$i]}"; rc=$?; i=$((i + 1))
  tag=p${r%:*}-g${r#*:}
  if [ "$rc" -ne 0 ]; then say "$tag: the probe failed (exit $rc; its [$tag] lines above say why)"; failed=1; touch "$SCRATCH/$tag.failed"; fi
done
say "probes done"
for r in $RUNS; do
  p=${r%:*}; g=${r#*:}; tag=p$p-g$g
  [ -f "$SCRATCH/$tag.failed" ] && continue
  var=WMAX_${p}_${g}
  if [ -n "${!var:-}" ]; then wmax=${!var}; elif [ "$g" -le 64 ]; then wmax="8 16 32"; else wmax="16 64 128 256"; fi
  # the binding rule of the recurrent-only note (session 33): two consecutive logs with all answers >= 0.45 and
  # first answers >= 0.30
  verdict=$(python3 - "$OUT/$tag.json" <<'EOF'
import json, sys
log = json.load(open(sys.argv[1]))["log"]
ok = [e["acc"] >= 0.45 and e["acc_first"] >= 0.30 for e in log]
bound = any(a and b for a, b in zip(ok, ok[1:]))
last = log[-1] if log else {}
print(("binds" if bound else "does not bind") + f" (last log: step {last.get('step')}, acc {last.get('acc', 0):.3f}, "
      f"first {last.get('acc_first', 0):.3f})")
EOF
)
  [ "$MASKS" = all ] && verdict="binds or not (MASKS=all): $verdict"
  say "$tag: $verdict"
  left=$(( T_START + BUDGET - 10 - $(date +%s) ))
  case $verdict in
    binds*) if [ "$left" -lt 20 ]; then say "$tag: ${left}s left: masks not run"; failed=1; continue; fi
      timeout "$left" python3 -m benchmarks.train.mqar_masks --save "$SCRATCH/$tag" --wmax $wmax --rows "$ROWS" \
        --device "$DEVICE" --out "$OUT/masks-$tag.json" 2>&1 | sed -u "s/^/[masks $tag] /" | tee -a "$LOG" > /dev/null
      rc=${PIPESTATUS[0]}; say "$tag: masks exit $rc$([ "$rc" = 124 ] && echo ' (cut by the budget)')"
      [ "$rc" -eq 0 ] || failed=1;;
    *) say "$tag: masks not run (the plan scores masks only on a model that binds)";;
  esac
done
say "done$([ $failed = 1 ] && echo ': a step failed (exit 1)')"
exit $failed
