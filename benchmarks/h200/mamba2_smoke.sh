#!/usr/bin/env bash
# H200 smoke of dasc serving a Mamba2 hybrid (issue 23), in ONE device call; modelled on runtime_smoke.sh.
#
# SGLang 0.5.17 serves a tiny Nemotron-H-shaped model (benchmarks/h200/sglang/nemotronh-tiny.config.json:
# 8 layers "M-M-M*M-" = 4 Mamba2 + 1 attention + 3 MLP, 16 Mamba2 heads of [head_dim 64, d_state 128],
# 8 B/C groups, hidden 1024) with --load-format dummy (SGLang's seeded dummy weights, the same in every
# server). The plans are compiled from a decay-only checkpoint with SYNTHETIC decay values (not trained;
# benchmarks/h200/mamba2_smoke_model.py): W_max = 16 keeps 32 of the 64 heads.
#   A. dense     : SGLang alone. The same 700-token prefix twice -> the 2nd request is a cache hit.
#   B. dasc_w16  : --dasc-plan W_max=16 (dasc-nr). The 2nd request is restored from the compressed pool
#                  (log "dasc: restoring ... compressed").
#   C. dasc_w0   : a plan that keeps every head: the restore is exact, so every output equals A's.
#   D. mismatch  : the W_max=16 plan WITHOUT --dasc-dummy-decay-ok: the served decay (SGLang's A =
#                  -exp(A_log) of the dummy weights) is not the plan's, so the server must refuse to start.
#   E. dasc_wr16 : (only when DASC_SMOKE_RUNS names it) the W_max=16 plan with load_policy wr: the hit runs
#                  a scratch pass through SGLang's Mamba2 layers and refresh_copy (log "dasc refreshed").
# B, C and E pass --dasc-dummy-decay-ok: dummy weights cannot match any compiled plan (D shows the check).
#
# Run from the repository root on the device, with .dev/sglang and .dev/dascwhl carried
# (made on the CPU machine by `bash benchmarks/h200/prepare_carry.sh`):
#   bash benchmarks/h200/mamba2_smoke.sh
#   DASC_SMOKE_RUNS="dasc_wr16" bash benchmarks/h200/mamba2_smoke.sh      # the dasc-wr run, in its own call
# Evidence goes to stdout; server logs and client JSON to $OUT.
set -uo pipefail
export OUT=${OUT:-/tmp/dasc-mamba2-smoke}
mkdir -p "$OUT"
DEV=.dev/sglang
CFG=benchmarks/h200/sglang/nemotronh-tiny.config.json
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export DASC_LOG_RESTORES=1
T0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }

stamp "setup: SGLang site, dasc install"
source benchmarks/h200/site_env.sh && dasc_site "$DEV/site.tar.xz" "$OUT" || exit 3
python3 -c "import sglang, torch; from importlib.metadata import entry_points as e; \
print('sglang', sglang.__version__, 'torch', torch.__version__, 'plugins', [x.value for x in e(group='sglang.srt.plugins')])"

stamp "model + plans"
python3 -m benchmarks.h200.mamba2_smoke_model "$CFG" /tmp/nemo || exit 3
python3 -m benchmarks.h200.smoke_model plan /tmp/nemo /tmp/plan-w16.dasc --wmax 16 || exit 3
python3 -m benchmarks.h200.smoke_model plan /tmp/nemo /tmp/plan-w0.dasc --wmax 0 || exit 3
python3 cli.py compile /tmp/nemo --wmax 16 --load-policy wr --out /tmp/plan-wr16.dasc || exit 3

stamp "kernel self-test (generated Triton pack/load vs PyTorch reference, CUDA, Mamba2 heads)"
smoke_selftest /tmp/plan-w16.dasc

COMMON=(--load-format dummy --skip-tokenizer-init --mem-fraction-static 0.5 --context-length 8192
        --disable-prefill-cuda-graph --max-running-requests 8 --log-level info)

serve() { smoke_serve /tmp/nemo "$@"; }   # serve PORT LABEL [extra flags...] (site_env.sh)

RUNS=${DASC_SMOKE_RUNS:-"dense dasc_w16 dasc_w0 mismatch"}   # dasc_wr16 on request: the 600 s device limit
want() { [[ " $RUNS " == *" $1 "* ]]; }
want dense && serve 31001 dense
want dasc_w16 && serve 31002 dasc_w16 --dasc-plan /tmp/plan-w16.dasc --dasc-pool-slots 64 --dasc-dummy-decay-ok
want dasc_w0 && serve 31003 dasc_w0 --dasc-plan /tmp/plan-w0.dasc --dasc-pool-slots 64 --dasc-dummy-decay-ok
want dasc_wr16 && serve 31005 dasc_wr16 --dasc-plan /tmp/plan-wr16.dasc --dasc-pool-slots 64 --dasc-dummy-decay-ok

if want mismatch; then
  stamp "mismatch: the W_max=16 plan on weights it was not compiled from (must refuse to start)"
  if pid=$(bash "$DEV/run_sglang.sh" "$DEV/site.tar.xz" /tmp/nemo 31004 "${COMMON[@]}" --dasc-plan /tmp/plan-w16.dasc \
           2>/dev/null); then
    echo "MISMATCH NOT REFUSED (server started)"; kill -TERM -- -"$pid"
  else
    echo "server exited as expected; its refusal:"
  fi
  grep -m3 -E "refusing to start" "$OUT/server_31004.log" | cut -c1-500
fi

stamp "summary"
python3 - "$OUT" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {p.stem[len("client_"):]: json.loads(p.read_text())["rows"] for p in sorted(out.glob("client_*.json"))}
for label, rows in runs.items():
    print(label, [(r["req"].split()[0], r["cached_tokens"]) for r in rows])
for port, label in ((31001, "dense"), (31002, "dasc_w16"), (31003, "dasc_w0"), (31004, "mismatch"), (31005, "dasc_wr16")):
    log = out / f"server_{port}.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    restores = [l for l in lines if "dasc: restoring" in l]
    plan = [l for l in lines if "dasc: plan" in l or "refusing to start" in l or "dummy weights" in l]
    refreshed = [l for l in lines if "dasc refreshed" in l]
    print(f"{label}: {len(restores)} restore line(s)", (restores[:1] or [""])[0][-140:], "|",
          (plan[:1] or [""])[0][-160:], "|", (refreshed[-1:] or [""])[0][-100:])
d, w0, w16 = runs.get("dense"), runs.get("dasc_w0"), runs.get("dasc_w16")
if d and w0:
    print("keep-all plan restores exactly: outputs dasc_w0 == dense for every request:",
          all(a["output_ids"] == b["output_ids"] for a, b in zip(d, w0)))
if d and w16:
    print("W_max=16 (dasc-nr, 32/64 heads kept): r2 output == dense r2:", d[1]["output_ids"] == w16[1]["output_ids"],
          "| r1 (no hit) == dense r1:", d[0]["output_ids"] == w16[0]["output_ids"])
PYEOF
stamp "done"
