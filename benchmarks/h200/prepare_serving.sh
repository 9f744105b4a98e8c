#!/usr/bin/env bash
# Build what benchmarks/h200/chat_bench.sh carries to the H200, from ONE commit (not the working tree,
# which other people may be editing): .dev/dascwhl/dasc-*.whl and .dev/ol/plans.tar.xz (calibrated
# Kimi-Linear plans w16, w16+INT8, w64 and w16 dasc-wr (policy file 'load_policy: wr') compiled by
# that commit's code, and arms.json from its serving_arms: dense int8 dasc-nr-w16 dasc-nr-w16-int8
# dasc-nr-w64 dasc-wr-w16, and the twins dasc-nr-w16-shadowfirst dasc-nr-w16-int8-shadowfirst
# dasc-wr-w16-shadowfirst (the same plans
# with DASC_EVICT_SHADOWED_FIRST=1, for an A/B of that eviction rule; RUNTIME_COMMIT must have it; and
# dasc-nr-w16-shadowfirst-nofork, the rule without its fork test, where COMMIT's serving_arms has -nofork:
# added only when RUNTIME_COMMIT's runtime reads DASC_EVICT_FORK_TEST (an older one would run it as the default); the
# plain dasc arms run with it 0, App. B.2's LRU, even on a wheel whose default is the rule: serving_arms
# writes 0, and sglang_server.server_env sets 0 for an older arms.json that has no value); a
# COMMIT whose serving_arms has no dasc-wr arms gets the first five, one without -shadowfirst no twins).
# Usage (repo root, CPU machine): bash benchmarks/h200/prepare_serving.sh [COMMIT] (default HEAD)
# Settings (env): DENSE_SLOTS (56), MRR (8), REFRESH_SLOTS (dasc-wr's scratch slots B, charged to its
# memory; default the runtime's), RUNTIME_COMMIT (the commit the dasc wheel is built from, default
# COMMIT: e.g. the last commit whose runtime has run on a GPU; its plans must be byte-identical; a
# dasc-wr arm needs a runtime with dasc-wr).
# Exit 2 when a call would send more than 64 MiB (counting the files that exist: parked ones do not travel).
set -euo pipefail
COMMIT=$(git rev-parse "${1:-HEAD}"); RUNTIME_COMMIT=$(git rev-parse "${RUNTIME_COMMIT:-$COMMIT}")
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
DENSE_SLOTS=${DENSE_SLOTS:-56}; MRR=${MRR:-8}
refresh=(); [ -n "${REFRESH_SLOTS:-}" ] && refresh=(--refresh-slots "$REFRESH_SLOTS")
B=$(mktemp -d /tmp/dasc-build.XXXXXX)
git archive "$COMMIT" | tar -x -C "$B"
mkdir -p .dev/dascwhl .dev/ol && rm -f .dev/ol/src.tar.xz   # left by the script's earlier versions; nothing reads it
tmpw=$(mktemp -d)
# the wheel leaves out the bundled reference checkpoints (the server needs none; ~0.6 MiB of the 64)
W=$B/wheel-src; mkdir -p "$W" && git archive "$RUNTIME_COMMIT" | tar -x -C "$W" && rm -rf "$W"/plans/reference/*
"$PY" -m pip wheel -q --no-deps -w "$tmpw" "$W" > /dev/null
rm -f .dev/dascwhl/*.whl && mv "$tmpw"/dasc-*.whl .dev/dascwhl/ && rm -rf "$tmpw"
P=$B/ol-plans; mkdir -p "$P"; printf 'int8: true\n' > "$B/int8.yaml"; printf 'load_policy: wr\n' > "$B/wr.yaml"
wr=(); grep -q 'dasc-wr-w' "$B/benchmarks/serving_arms.py" && wr=(dasc-wr-w16)
shadow=(); grep -q 'shadowfirst' "$B/benchmarks/serving_arms.py" && shadow=(dasc-nr-w16-shadowfirst dasc-nr-w16-int8-shadowfirst "${wr[@]/%/-shadowfirst}")
grep -q 'nofork' "$B/benchmarks/serving_arms.py" && grep -q DASC_EVICT_FORK_TEST "$W/runtime/tier_operations.py" && shadow+=(dasc-nr-w16-shadowfirst-nofork)
REF=plans/reference/kimi-linear-48b-a3b-calibrated
(cd "$B" && "$PY" cli.py compile "$REF" --wmax 16 --out "$P/w16-tp1-off" -q \
    && "$PY" cli.py compile "$REF" --wmax 16 --policy "$B/int8.yaml" --out "$P/w16-int8-tp1-off" -q \
    && "$PY" cli.py compile "$REF" --wmax 64 --out "$P/w64-tp1-off" -q \
    && { [ ${#wr[@]} = 0 ] || "$PY" cli.py compile "$REF" --wmax 16 --policy "$B/wr.yaml" --out "$P/w16-wr-tp1-off" -q; } \
    && "$PY" -c "import sys, importlib; sys.path.insert(0, '.'); [sys.modules.setdefault(a, importlib.import_module(f)) for a, f in (('dasc_runtime', 'runtime'), ('dasc_templates', 'templates'), ('dasc_plans', 'plans'))]; from benchmarks.serving_arms import main; sys.exit(main(sys.argv[1:]))" \
       --plans "$P" --dense-slots "$DENSE_SLOTS" --max-running-requests "$MRR" \
       --arms dense int8 dasc-nr-w16 dasc-nr-w16-int8 dasc-nr-w64 "${wr[@]}" "${shadow[@]}" "${refresh[@]}" --out "$P/arms.json")
printf 'plans %s\ndasc wheel %s\n' "$COMMIT" "$RUNTIME_COMMIT" > "$P/COMMIT"
tar -C "$P" -cf - . | xz -9 > .dev/ol/plans.tar.xz
rm -rf "$B"
sizes() { "$PY" -c 'import os, sys; print(sum(os.path.getsize(p) for p in sys.stdin.read().split("\0") if p and os.path.isfile(p)))'; }
tree=$(git ls-files -z --cached --others --exclude-standard | sizes)
# .dev/jit (the compile caches a call returned, chat_bench.sh) travels too when it is there
jit=(); [ -d .dev/jit ] && jit=(.dev/jit)
[ -d .dev/sglang ] || echo "note: no .dev/sglang yet (bash benchmarks/h200/prepare_carry.sh builds it for a device call; a CPU rehearsal with the fake server needs none)"
carried=$(find .dev/dascwhl .dev/ol "${jit[@]}" $([ -d .dev/sglang ] && echo .dev/sglang) -type f -print0 | sizes)
mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }
echo "commit $COMMIT (wheel $RUNTIME_COMMIT): working tree $(mib "$tree") MiB + carried $(mib "$carried") MiB = $(mib $((tree + carried))) MiB of 64 (carry: .dev/sglang .dev/dascwhl .dev/ol${jit:+ .dev/jit})"
ls -la .dev/dascwhl .dev/ol
[ $((tree + carried)) -le $((64 * 1024 * 1024)) ] || { echo "error: over the 64 MiB a device call may send; park what no serving call reads: python -m benchmarks.h200.park park bundles, then (with .dev/jit) park benchmarks/results (README 'Parking bundled models'), restore after the call" >&2; exit 2; }
