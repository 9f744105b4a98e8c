# Sourced by the H200 drivers (repo root of a device call): `source benchmarks/h200/site_env.sh; dasc_site TAR OUT`.
# dasc_site unpacks the carried SGLang site (TAR, e.g. .dev/sglang/site.tar.xz) into /tmp/site once per machine,
# installs dasc there from the carried wheel .dev/dascwhl/dasc-*.whl when its hash differs from the one installed
# (a warm machine keeps it; without a wheel, the checkout editable, which the image's setuptools may refuse), and
# puts /tmp/site first on PYTHONPATH (the carried transformers must win over the image's). pip's log: OUT/pip.log.
# Returns 3, with the log's tail, when a step fails.
dasc_site() {
  local tar=$1 log=$2/pip.log whl h
  if [ ! -f /tmp/site/.done ]; then
    mkdir -p /tmp/site && tar -C /tmp/site -xJf "$tar" && touch /tmp/site/.done || { echo "unpack of $tar failed"; return 3; }
  fi
  whl=$(ls .dev/dascwhl/dasc-*.whl 2>/dev/null | head -n 1)
  if [ -n "$whl" ]; then
    h=$(sha256sum "$whl" | cut -c1-16)
    if [ "$(cat /tmp/site/.dasc-whl 2>/dev/null)" != "$h" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl" \
        > "$log" 2>&1 || { tail -n 20 "$log"; return 3; }
      echo "$h" > /tmp/site/.dasc-whl
    fi
  else
    python3 -m pip install -q --no-deps --no-build-isolation -e . > "$log" 2>&1 || { tail -n 20 "$log"; return 3; }
  fi
  case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ;; esac
}

# The runtime smokes (runtime_smoke.sh, mamba2_smoke.sh) share these two steps.
# smoke_selftest PLAN: the plan's generated Triton pack/load against the PyTorch reference on CUDA; when it
# fails, the servers that follow use DASC_OPS=reference.
smoke_selftest() {
  if ! python3 -m benchmarks.h200.smoke_model selftest "$1" 2>&1 | tail -3; then
    echo "kernel self-test failed: servers below use DASC_OPS=reference"; export DASC_OPS=reference
  fi
}

# smoke_serve MODEL PORT LABEL [extra flags...]: start SGLang on MODEL (DEV/run_sglang.sh with the caller's
# COMMON flags), run runtime_smoke_client.py against it (OUT/client_LABEL.json), stop it, print its dasc log
# lines. Needs the caller's DEV, OUT, COMMON and stamp.
smoke_serve() {
  local model=$1 port=$2 label=$3; shift 3
  stamp "$label: start (port $port) $*"
  local pid
  pid=$(bash "$DEV/run_sglang.sh" "$DEV/site.tar.xz" "$model" "$port" "${COMMON[@]}" "$@")
  local rc=$?
  if [ $rc -ne 0 ]; then echo "$label: server did not start (rc $rc)"; return $rc; fi
  stamp "$label: up"
  python3 benchmarks/h200/runtime_smoke_client.py "$port" "$label" "$OUT/client_$label.json"
  kill -TERM -- -"$pid" 2>/dev/null; sleep 6; kill -KILL -- -"$pid" 2>/dev/null
  echo "--- $label: dasc log lines"
  grep -E "dasc|Prefill batch" "$OUT/server_$port.log" | grep -vE "Available plugins|  - dasc" | cut -c1-300 | tail -12
  return 0
}

# Compile caches across device calls. A fresh machine spends most of a Kimi-Linear server's ~200 s start in
# run-time compilation (Triton kernels while the decode CUDA graphs are captured, ~60 s; the first prefills,
# ~60 s more); a warm machine keeps that work. jit_env points Triton, TorchInductor and FlashInfer (through
# XDG_CACHE_HOME) at JIT_DIR (/tmp/jit); jit_restore DIR unpacks DIR/jit.tar.xz there when a call carries one
# (the last call's $OUT file, copied to .dev/jit/); jit_save OUT packs JIT_DIR into OUT/jit.tar.xz when it fits
# one returned file (JIT_LIMIT_MIB, 15), else says its size and leaves it out. Each step prints what it did and
# none fails a call (a cache that does not come back only costs the compile time again).
jit_env() {
  local d=${JIT_DIR:-/tmp/jit}
  mkdir -p "$d/triton" "$d/inductor" "$d/xdg"
  export TRITON_CACHE_DIR=$d/triton TORCHINDUCTOR_CACHE_DIR=$d/inductor XDG_CACHE_HOME=$d/xdg
}
jit_restore() {
  local tar=$1/jit.tar.xz d=${JIT_DIR:-/tmp/jit}
  jit_env
  if [ -f "$tar" ] && [ ! -f "$d/.restored" ]; then
    if tar -C "$d" -xJf "$tar"; then touch "$d/.restored"; echo "jit cache: restored $(du -sh "$d" | cut -f1) from $tar"
    else echo "jit cache: unpack of $tar failed; compiling afresh"; fi
  else
    echo "jit cache: none carried (or already restored on this machine)"
  fi
}
jit_save() {
  local out=$1 d=${JIT_DIR:-/tmp/jit} limit=$(( ${JIT_LIMIT_MIB:-15} * 1048576 )) size
  echo "jit cache: $(du -sh "$d"/* 2>/dev/null | tr '\t\n' ' ')"
  XZ_OPT=-T0 tar -C "$d" -cJf "$out/jit.tar.xz" --exclude=.restored . 2>/dev/null || { echo "jit cache: pack failed"; rm -f "$out/jit.tar.xz"; return 0; }
  size=$(stat -c %s "$out/jit.tar.xz")
  if [ "$size" -gt "$limit" ]; then
    echo "jit cache: $((size / 1048576)) MiB packed, over the ${JIT_LIMIT_MIB:-15} MiB of one returned file: not saved"
    rm -f "$out/jit.tar.xz"
  else
    echo "jit cache: saved $((size / 1024)) KiB to $out/jit.tar.xz (next call: copy it to .dev/jit/ and carry .dev/jit)"
  fi
}
