#!/usr/bin/env bash
# H200 smoke of dasc serving a Mamba2 hybrid (issue 23), in ONE device call; modelled on runtime_smoke.sh.
#
# SGLang 0.5.17 serves a tiny Nemotron-H-shaped model (benchmarks/h200/sglang/nemotronh-tiny.config.json:
# 8 layers "M-M-M*M-" = 4 Mamba2 + 1 attention + 3 MLP, 16 Mamba2 heads of [head_dim 64, d_state 128],
# 8 B/C groups, hidden 1024) with --load-format dummy (SGLang's seeded dummy weights, the same in every
# server). The plans are compiled from a decay-only checkpoint with SYNTHETIC decay values (not trained;
# benchmarks/h200/mamba2_smoke_model.py): W_max = 16 keeps 32 of the 64 heads.
#   A. dense     : SGLang alone. The same 700-token prefix twice -> the 2nd request is a cache hit (512 tokens:
#                  SGLang checkpoints Mamba states every max(mamba_chunk_size 256, page 1) prefill tokens).
#   B. dasc_w16  : --dasc-plan W_max=16 (dasc-nr). The 2nd request is restored from the compressed pool
#                  (log "dasc: restoring ... compressed").
#   C. dasc_w0   : a plan that keeps every head: the restore is exact, so every output equals A's.
#   D. mismatch  : the W_max=16 plan WITHOUT --dasc-dummy-decay-ok: the served decay (SGLang's A =
#                  -exp(A_log) of the dummy weights) is not the plan's, so the server must refuse to start
#                  with dasc's own decay refusal (started in the background beside A: it never serves).
#   E. dasc_wr16 : (only when DASC_SMOKE_RUNS names it) the W_max=16 plan with load_policy wr: the hit runs
#                  a scratch pass through SGLang's Mamba2 layers and refresh_copy (log "dasc refreshed").
# B, C and E also log a restore check per hit (DASC_RESTORE_CHECK, runtime/restore_check.py): the restored slot
# against the PyTorch reference of the state that was stored, which must be 0 (the dummy weights' outputs barely
# depend on the state, so output equality alone would not show an exact restore).
# B, C and E pass --dasc-dummy-decay-ok: dummy weights cannot match any compiled plan (D shows the check).
# Each case is PASS or FAILED from evidence (start record, client answers, restore / refusal log lines, output
# equality): benchmarks/h200/mamba2_smoke_verdict.py says what each needs. Exit status 1 when a case failed,
# 3 when set-up failed.
#
# Attention backend: SGLang 0.5.17 refuses triton for NemotronH (server_args.py:5499-5506; its triton backend
# reads layer 0's KV buffer, triton_backend.py:199-210, and layer 0 is a Mamba2 layer here), Hopper's default fa3
# is stripped from the carried site (slim_site.sh removes sgl_kernel/flash_ops; fa3's other source is a
# download), and flashinfer has no prebuilt kernels in the site (JIT with nvcc at first use). torch_native
# (PyTorch SDPA, attention_registry.py:188-192) needs nothing compiled; it turns CUDA graphs off
# (server_args.py:5751-5756), which also shortens start-up. DASC_SMOKE_ATTN=flashinfer tries the JIT path.
# --attention-backend is given after run_sglang.sh's own "--attention-backend triton", so it wins (argparse).
# --mamba-radix-cache-strategy extra_buffer is what "auto" resolves to here (overrides.py:1493-1502), named
# as serving_arms.py does; --moe-runner-backend triton keeps NemotronH's "auto" -> flashinfer_cutlass override
# (overrides.py:1205-1227) out of the way (the model has no MoE layer).
#
# Run from the repository root on the device, with .dev/sglang and .dev/dascwhl carried
# (made on the CPU machine by `bash benchmarks/h200/prepare_carry.sh`):
#   bash benchmarks/h200/mamba2_smoke.sh
#   DASC_SMOKE_RUNS="dasc_wr16" bash benchmarks/h200/mamba2_smoke.sh      # the dasc-wr run, in its own call
# A served case not started by DASC_SMOKE_DEADLINE seconds (default 450) is skipped and FAILED, so that the
# summary prints inside the 600 s device limit.
# Evidence goes to stdout; server logs, client JSON, start records (start_LABEL.rc) and the mismatch case's pid files
# (mismatch.pid, mismatch.runner) to $OUT.
set -uo pipefail
export OUT=${OUT:-/tmp/dasc-mamba2-smoke}
mkdir -p "$OUT"
rm -f "$OUT"/client_*.json "$OUT"/server_310*.log "$OUT"/start_*.rc   # a local re-run: no stale evidence
exec > >(tee "$OUT/smoke.log") 2>&1   # the call's own evidence (kernel self-test, timings, verdict) comes back with the logs
DEV=.dev/sglang
CFG=benchmarks/h200/sglang/nemotronh-tiny.config.json
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export DASC_LOG_RESTORES=1
export DASC_RESTORE_CHECK=8     # runtime/restore_check.py: the first 8 stored states checked at their restore
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

COMMON=(--attention-backend "${DASC_SMOKE_ATTN:-torch_native}" --mamba-radix-cache-strategy extra_buffer
        --moe-runner-backend triton --load-format dummy --skip-tokenizer-init --mem-fraction-static 0.5
        --context-length 8192 --disable-prefill-cuda-graph --max-running-requests 8 --log-level info)

RUNS=${DASC_SMOKE_RUNS:-"dense dasc_w16 dasc_w0 mismatch"}   # dasc_wr16 on request: the 600 s device limit
DEADLINE=${DASC_SMOKE_DEADLINE:-450}
want() { [[ " $RUNS " == *" $1 "* ]]; }
# serve PORT LABEL [extra flags...] (site_env.sh smoke_serve); OUT/start_LABEL.rc records how its start went
serve() {
  if [ $(( $(date +%s) - T0 )) -ge "$DEADLINE" ]; then
    echo "$2: NOT STARTED: past the ${DEADLINE} s deadline"
    echo "skipped (past the ${DEADLINE} s deadline)" > "$OUT/start_$2.rc"
    return 1
  fi
  smoke_serve /tmp/nemo "$@"; local rc=$?
  echo "$rc" > "$OUT/start_$2.rc"; return $rc
}

if want mismatch; then
  # In the background beside the first served case: it must die at model load. Its own --mem-fraction-static
  # 0.3 (the later flag wins) leaves room for the case beside it should it start by mistake; it is then stopped
  # at once and the case fails.
  stamp "mismatch: the W_max=16 plan on weights it was not compiled from (must refuse to start; background)"
  rm -f "$OUT/mismatch.pid" "$OUT/mismatch.runner"
  ( bash "$DEV/run_sglang.sh" "$DEV/site.tar.xz" /tmp/nemo 31004 "${COMMON[@]}" --mem-fraction-static 0.3 \
        --dasc-plan /tmp/plan-w16.dasc > "$OUT/mismatch.pid" 2>/dev/null &
    echo $! > "$OUT/mismatch.runner"; wait $!; rc=$?
    if [ $rc -eq 0 ]; then
      echo "MISMATCH NOT REFUSED (server started): stopping it"; kill -TERM -- -"$(cat "$OUT/mismatch.pid")"
    fi
    echo "$rc" > "$OUT/start_mismatch.rc" ) &
  MISMATCH_JOB=$!
  sleep 4
fi
want dense && serve 31001 dense
want dasc_w16 && serve 31002 dasc_w16 --dasc-plan /tmp/plan-w16.dasc --dasc-pool-slots 64 --dasc-dummy-decay-ok
want dasc_w0 && serve 31003 dasc_w0 --dasc-plan /tmp/plan-w0.dasc --dasc-pool-slots 64 --dasc-dummy-decay-ok
want dasc_wr16 && serve 31005 dasc_wr16 --dasc-plan /tmp/plan-wr16.dasc --dasc-pool-slots 64 --dasc-dummy-decay-ok

if want mismatch; then   # its start result; wait for it at most until DEADLINE + 90 s
  while [ ! -f "$OUT/start_mismatch.rc" ] && [ $(( $(date +%s) - T0 )) -lt $(( DEADLINE + 90 )) ]; do sleep 2; done
  if [ -f "$OUT/start_mismatch.rc" ]; then
    wait "$MISMATCH_JOB" 2>/dev/null
    echo "--- mismatch: start exit code $(cat "$OUT/start_mismatch.rc") (0 = it started); dasc refusal lines:"
    grep -m3 -E "dasc: refusing to start" "$OUT/server_31004.log" | cut -c1-500
  else
    echo "--- mismatch: still starting at $(( $(date +%s) - T0 )) s: its start-up wait is stopped"
    kill -TERM "$(cat "$OUT/mismatch.runner" 2>/dev/null)" "$MISMATCH_JOB" 2>/dev/null
  fi
fi

stamp "summary"
python3 - "$OUT" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for p in sorted(out.glob("client_*.json")):
    rows = json.loads(p.read_text())["rows"]
    print(p.stem[len("client_"):], [(r["req"].split()[0], r["cached_tokens"]) for r in rows])
PYEOF
python3 -m benchmarks.h200.mamba2_smoke_verdict "$OUT" "$RUNS"
status=$?
stamp "done"
exit $status
