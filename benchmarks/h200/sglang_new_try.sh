#!/usr/bin/env bash
# ONE try of SGLang 0.5.23 on the H200 (issue 21 item 5): does the newest tested SGLang, with dasc's plugin,
# start on the image's torch 2.11 and serve a tiny model? GPU serving runs stay on 0.5.17 unless this works.
#
# Why it may not: SGLang 0.5.23 and its sglang-kernel 0.4.10 pin torch 2.14.1; the image has torch 2.11.0+cu130
# and reaches no package index, and one call carries at most 64 MiB, so torch 2.14.1 (GBs of CUDA wheels)
# cannot travel. The try carries everything else (a stripped site built from sglang/wheels-0.5.23.txt) and
# records where it stops: torch / sgl_kernel import (compiled against torch 2.14's C++ ABI), SGLang's
# imports, dasc's adapter pick, then a dense and a dasc server on the tiny Qwen3-Next model.
#
# On the CPU machine (pip access), once (about 5 minutes):
#   WHEELS=benchmarks/h200/sglang/wheels-0.5.23.txt WORK=/tmp/dasc-sglang-new-site \
#     bash benchmarks/h200/sglang/build_site.sh .dev/sglang-new/site.tar.xz
#   cp benchmarks/h200/sglang/qwen3next-tiny.config.json benchmarks/h200/sglang/smoke_client.py .dev/sglang-new/
#   rm -rf .dev/dascwhl && python3 -m pip wheel -q --no-deps -w .dev/dascwhl .
# Device call: run(command="bash benchmarks/h200/sglang_new_try.sh", carry=[".dev/sglang-new", ".dev/dascwhl"],
#   kind="nvidia-h200", timeout_s=600); the carry must stay under 64 MiB (build_site.sh prints the tarball size).
# Evidence: stdout and $OUT/sglang_new_try/ (server logs, client JSON).
set -uo pipefail
OUT=${OUT:-/tmp}/sglang_new_try
mkdir -p "$OUT"
SITE=/tmp/site-new
T0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
step() {  # step NAME CMD...: run, print OK/FAILED with the last lines, return its status
  local name=$1; shift
  if "$@" > "$OUT/$name.log" 2>&1; then echo "OK     $name: $(tail -1 "$OUT/$name.log")"; return 0; fi
  echo "FAILED $name:"; tail -15 "$OUT/$name.log"; return 1
}

stamp "unpack the SGLang 0.5.23 site and the dasc wheel"
[ -f .dev/sglang-new/site.tar.xz ] || { echo "missing .dev/sglang-new/site.tar.xz (see the header)"; exit 3; }
if [ ! -f $SITE/.done ]; then
  mkdir -p $SITE && tar -C $SITE -xJf .dev/sglang-new/site.tar.xz && touch $SITE/.done || { echo "unpack failed"; exit 3; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE .dev/dascwhl/dasc-*.whl \
  > "$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 3; }
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

stamp "imports on the image's torch"
step torch python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
step sgl_kernel python3 -c "import sgl_kernel, torch; print('sgl_kernel', sgl_kernel.__version__, 'loaded on torch', torch.__version__)"
kernel=$?
step sglang python3 -c "import sglang; from sglang.srt.mem_cache.unified_cache.components import MambaComponent; \
from sglang.srt.model_executor.model_runner import ModelRunner; print('sglang', sglang.__version__)"
imports=$?
step dasc_adapter python3 -c "from dasc_runtime.sglang_api import api; from dasc_runtime.plugin import hooks; \
print('dasc adapter', api().VERSION, len(hooks()), 'hooks')"
if [ $kernel -ne 0 ] || [ $imports -ne 0 ]; then
  stamp "stopped before serving: SGLang 0.5.23 does not load on torch $(python3 -c 'import torch; print(torch.__version__)')"
  exit 1
fi

stamp "tiny model and a plan, then one dense and one dasc server"
CFG=.dev/sglang-new/qwen3next-tiny.config.json
python3 -m benchmarks.h200.smoke_model checkpoint "$CFG" /tmp/tiny || exit 3
python3 -m benchmarks.h200.smoke_model plan /tmp/tiny /tmp/plan-w16.dasc --wmax 16 || exit 3
COMMON=(--skip-tokenizer-init --mem-fraction-static 0.5 --context-length 8192 --disable-prefill-cuda-graph
        --max-running-requests 8 --log-level info)
serve() {  # serve PORT LABEL [extra flags...]: start on the 0.5.23 site (not run_sglang.sh: it puts /tmp/site first)
  local port=$1 label=$2; shift 2
  stamp "server $label"
  setsid python3 -m sglang.launch_server --model-path /tmp/tiny --port "$port" --attention-backend triton \
    --sampling-backend pytorch "${COMMON[@]}" "$@" > "$OUT/server_$port.log" 2>&1 &
  local pid=$! up=0
  for _ in $(seq 1 150); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
      2>/dev/null && { up=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 2
  done
  if [ $up -eq 0 ]; then echo "FAILED $label: server did not start"; tail -30 "$OUT/server_$port.log"
  else
    python3 .dev/sglang-new/smoke_client.py "$port" 60 > "$OUT/client_$label.json" 2>&1 \
      && echo "OK     $label: $(tail -1 "$OUT/client_$label.json")" || { echo "FAILED $label client"; tail -5 "$OUT/client_$label.json"; }
    grep -m3 "dasc" "$OUT/server_$port.log" || true
  fi
  kill -TERM -- -"$pid" 2>/dev/null; sleep 3
}
serve 30000 dense
serve 30001 dasc-w16 --dasc-plan /tmp/plan-w16.dasc
stamp "done"
