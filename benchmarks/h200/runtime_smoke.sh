#!/usr/bin/env bash
# H200 smoke of the dasc SGLang runtime, in ONE device call (the recipe: benchmarks/h200/README.md).
#
# What it shows, with SGLang 0.5.17 serving a tiny Qwen3-Next-architecture model (config
# .dev/sglang/qwen3next-tiny.config.json; seeded random weights, SYNTHETIC decay values, not trained):
#   A. dense         : SGLang alone. The same 700-token prefix twice -> the 2nd request is a cache hit.
#   B. dasc W_max=16 : --dasc-plan (4 of 8 heads kept per layer). The 2nd request is a hit restored
#                      from the compressed pool (log: "dasc: restoring 1 compressed (local units zero-filled)"; "(dasc-nr)" before f01e297).
#   C. dasc W_max=0  : a plan that keeps every head. The restore is exact, so every output equals A's.
#   D. mismatch      : a plan compiled from other decay values -> the server refuses to start.
# Weights are a real safetensors checkpoint (not --load-format dummy): SGLang's dummy loader gives
# every head the same decay, so no plan could tell heads apart, and the fingerprint check needs the
# plan to be compiled from the weights actually served.
#
# Run from the repository root on the device, with .dev/sglang carried:
#   bash benchmarks/h200/runtime_smoke.sh
# Needs .dev/sglang/{site.tar.xz,run_sglang.sh,qwen3next-tiny.config.json} and .dev/dascwhl, made on the CPU
# machine by `bash benchmarks/h200/prepare_carry.sh`.
# Evidence goes to stdout; server logs and client JSON to $OUT.
set -uo pipefail
export OUT=${OUT:-/tmp/dasc-smoke}
mkdir -p "$OUT"
exec > >(tee "$OUT/smoke.log") 2>&1   # the call's own evidence (kernel self-test, timings) comes back with the logs
DEV=.dev/sglang
CFG=$DEV/qwen3next-tiny.config.json
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export DASC_LOG_RESTORES=1
export DASC_RESTORE_CHECK=8     # runtime/restore_check.py: each restored slot against the PyTorch reference of its stored state
T0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }

stamp "setup: SGLang site, dasc install"
# dasc as a wheel built beforehand on the CPU machine (`pip wheel --no-deps -w .dev/dascwhl .`), carried in
# .dev/dascwhl: the image's setuptools cannot build it in place; the dist-info carries the plugin entry point.
source benchmarks/h200/site_env.sh && dasc_site "$DEV/site.tar.xz" "$OUT" || exit 3
python3 -c "import sglang, torch; from importlib.metadata import entry_points as e; \
print('sglang', sglang.__version__, 'torch', torch.__version__, 'plugins', [x.value for x in e(group='sglang.srt.plugins')])"

stamp "model + plans"
python3 -m benchmarks.h200.smoke_model checkpoint "$CFG" /tmp/tiny || exit 3
python3 -m benchmarks.h200.smoke_model checkpoint "$CFG" /tmp/tiny-other --other-decay --decay-only || exit 3
python3 -m benchmarks.h200.smoke_model plan /tmp/tiny /tmp/plan-w16.dasc --wmax 16 || exit 3
python3 -m benchmarks.h200.smoke_model plan /tmp/tiny /tmp/plan-w0.dasc --wmax 0 || exit 3
python3 -m benchmarks.h200.smoke_model plan /tmp/tiny-other /tmp/plan-other.dasc --wmax 16 || exit 3

stamp "kernel self-test (generated Triton pack/load vs PyTorch reference, CUDA)"
smoke_selftest /tmp/plan-w16.dasc

COMMON=(--skip-tokenizer-init --mem-fraction-static 0.5 --context-length 8192 --disable-prefill-cuda-graph
        --max-running-requests 8 --log-level info)

serve() { smoke_serve /tmp/tiny "$@"; }   # serve PORT LABEL [extra flags...] (site_env.sh)

RUNS=${DASC_SMOKE_RUNS:-"dense dasc_w16 dasc_w0 mismatch"}   # drop a run to fit the 600 s device limit
want() { [[ " $RUNS " == *" $1 "* ]]; }
want dense && serve 30001 dense
want dasc_w16 && serve 30002 dasc_w16 --dasc-plan /tmp/plan-w16.dasc --dasc-pool-slots 64
want dasc_w0 && serve 30003 dasc_w0 --dasc-plan /tmp/plan-w0.dasc --dasc-pool-slots 64

want mismatch && stamp "mismatch: plan compiled from other decay tensors (must refuse to start)"
if ! want mismatch; then :
elif pid=$(bash "$DEV/run_sglang.sh" "$DEV/site.tar.xz" /tmp/tiny 30004 "${COMMON[@]}" --dasc-plan /tmp/plan-other.dasc \
         2>/dev/null); then
  echo "MISMATCH NOT REFUSED (server started)"; kill -TERM -- -"$pid"
else
  echo "server exited as expected; its refusal:"
fi
want mismatch && grep -m3 -E "refusing to start" "$OUT/server_30004.log" | cut -c1-500

stamp "summary"
python3 - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {p.stem[len("client_"):]: json.loads(p.read_text())["rows"] for p in sorted(out.glob("client_*.json"))}
for label, rows in runs.items():
    print(label, [(r["req"].split()[0], r["cached_tokens"]) for r in rows])
for port, label in ((30001, "dense"), (30002, "dasc_w16"), (30003, "dasc_w0"), (30004, "mismatch")):
    log = out / f"server_{port}.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    restores = [l for l in lines if "dasc: restoring" in l]
    plan = [l for l in lines if "dasc: plan" in l or "refusing to start" in l]
    print(f"{label}: {len(restores)} restore line(s)", (restores[:1] or [""])[0][-140:], "|", (plan[:1] or [""])[0][-160:])
    checks = [l[l.find("dasc restore check"):] for l in lines if "dasc restore check" in l]
    if checks:
        print(f"{label}: {len(checks)} restore check(s) (0 = the restored slot equals the PyTorch reference):",
              " | ".join(checks[:3]))
d, w0, w16 = runs.get("dense"), runs.get("dasc_w0"), runs.get("dasc_w16")
if d and w0:
    print("keep-all plan restores exactly: outputs dasc_w0 == dense for every request:",
          all(a["output_ids"] == b["output_ids"] for a, b in zip(d, w0)))
if d and w16:
    print("W_max=16 (dasc-nr, 24/48 heads kept): r2 output == dense r2:", d[1]["output_ids"] == w16[1]["output_ids"],
          "| r1 (no hit) == dense r1:", d[0]["output_ids"] == w16[0]["output_ids"])
EOF
stamp "done"
