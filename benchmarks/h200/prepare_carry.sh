#!/usr/bin/env bash
# Build the three git-ignored folders that an H200 device call carries (the device machine has no
# network; one call may send at most 64 MiB: tracked files + carried folders):
#   .dev/sglang   SGLang 0.5.17 and its start-up needs as one xz tarball (~39 MiB, trimmed by
#                 sglang/slim_site.sh; one built before that trim is ~57 MiB and no longer fits), plus
#                 the helper scripts of benchmarks/h200/sglang/ (run_sglang.sh, smoke_client.py,
#                 qwen3next-tiny.config.json) used by benchmarks/h200/runtime_smoke.sh
#   .dev/dascwhl  this checkout as a wheel (rebuilt on every run: re-run after any change to the
#                 packaged folders dasc_compile/, runtime/, templates/ or plans/)
#   .whl          only with --pydantic: pydantic 2 and its needs for CPython 3.12, for calls that do
#                 not carry the SGLang tarball (the H200 image has no pydantic; the tarball holds the
#                 same versions, so the benchmarks/h200/*.sh drivers do not need .whl)
# Usage (repo root, CPU machine with pip access to PyPI or a mirror):
#   bash benchmarks/h200/prepare_carry.sh               # tarball (only if missing) + dasc wheel
#   bash benchmarks/h200/prepare_carry.sh --no-site     # skip the SGLang tarball (~5 min to build)
#   bash benchmarks/h200/prepare_carry.sh --pydantic    # also .whl (kernel / TP runs without SGLang)
#   bash benchmarks/h200/prepare_carry.sh --check       # build nothing, only add up what a call sends
# Without --pydantic an existing .whl/ is removed, so that it cannot travel by mistake.
# Then name .dev/sglang and .dev/dascwhl (and .whl if made) in the device call's `carry`; the H200
# drivers (benchmarks/h200/*.sh) unpack and install them. Exit 2, with one line, when what travels would
# not fit in 64 MiB: tracked files + untracked files git does not ignore + shared/ + the carried folders.
set -euo pipefail
SITE=1; PYD=0; CHECK=0
for arg in "$@"; do
  case $arg in
    --no-site) SITE=0 ;;
    --pydantic) PYD=1 ;;
    --check) CHECK=1 ;;
    *) echo "error: unknown option '$arg' (expected --no-site, --pydantic and/or --check)" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo "$ROOT/.venv/bin/python" || echo python3)}
# NUL-separated paths on stdin that exist as files (a parked file is tracked but deleted: it does not travel)
existing() { "$PY" -c 'import os, sys; sys.stdout.write("".join(p + "\0" for p in sys.stdin.read().split("\0") if p and os.path.isfile(p)))'; }
if [ "$CHECK" = 0 ]; then
  mkdir -p .dev/sglang .dev/dascwhl
  cp benchmarks/h200/sglang/run_sglang.sh benchmarks/h200/sglang/smoke_client.py \
     benchmarks/h200/sglang/qwen3next-tiny.config.json .dev/sglang/
  if [ "$SITE" = 1 ] && [ ! -s .dev/sglang/site.tar.xz ]; then
    echo "building .dev/sglang/site.tar.xz (downloads the wheels of benchmarks/h200/sglang/wheels.txt)"
    bash benchmarks/h200/sglang/build_site.sh .dev/sglang/site.tar.xz
  fi
  # The device wheel is built from a copy of the checkout without the bundled trained eval models
  # (plans/reference/* with a weight file over 1 MiB or a shard index, e.g. the 6.3 MB kda-hybrid-3m, or a
  # config.json whose weights are parked): no device driver reads them, and they would travel twice (tree +
  # wheel), over the 64 MiB a call may send. Files parked by park.py (deleted, still tracked) are skipped.
  tmpw=$(mktemp -d); src="$tmpw/src"; mkdir -p "$src"
  git ls-files -z --cached --others --exclude-standard | existing | tar --null -T - -cf - | tar -xf - -C "$src"
  for d in "$src"/plans/reference/*/; do
    big=$(find "$d" -maxdepth 1 -name '*.safetensors' -size +1048576c | head -1)
    if [ -n "$big" ] || [ -f "$d/model.safetensors.index.json" ] \
       || { [ -f "$d/config.json" ] && ! ls "$d"/*.safetensors > /dev/null 2>&1; }; then
      echo "device wheel leaves out ${d#"$src"/} (an eval model no device driver reads, or its weights are parked)"
      rm -rf "$d"
    fi
  done
  if ! (cd "$src" && "$PY" -m pip wheel -q --no-deps -w "$tmpw" .); then
    rm -rf "$tmpw"; echo "error: pip wheel of $ROOT failed (the wheel in .dev/dascwhl is unchanged)" >&2; exit 3
  fi
  rm -f .dev/dascwhl/*.whl && mv "$tmpw"/dasc-*.whl .dev/dascwhl/ && rm -rf "$tmpw"
  rm -rf .whl
  if [ "$PYD" = 1 ]; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  fi
fi
# what a call sends: tracked files, untracked files git does not ignore, shared/, and the carried folders
sizes() { "$PY" -c 'import os, sys; print(sum(os.path.getsize(p) for p in set(sys.stdin.read().split("\0")) if p and os.path.isfile(p) and not os.path.islink(p)))'; }
tree=$( { git ls-files -z --cached --others --exclude-standard; [ -d shared ] && find shared -type f -print0; true; } | sizes)
limit=$((64 * 1024 * 1024)); total=$tree
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
parts="tree $(mib "$tree")"
for c in .dev/sglang .dev/dascwhl .whl; do
  [ -d "$c" ] || continue
  n=$(find "$c" -type f -print0 | sizes); total=$((total + n)); parts="$parts + $c $(mib "$n")"
done
echo "a device call carrying .dev/sglang .dev/dascwhl$([ -d .whl ] && echo ' .whl') sends $parts = $(mib "$total") MiB of 64 MiB ($(mib $((limit - total))) MiB left)"
[ -s .dev/sglang/site.tar.xz ] || echo "warning: .dev/sglang/site.tar.xz is missing (--no-site): the drivers need it, and it is not counted above" >&2
if [ "$total" -gt "$limit" ]; then
  hint="carry less, or park bundled models the call does not need (python -m benchmarks.h200.park park bundles, or park PATH ...; README 'Parking bundled models')"
  [ -f .dev/sglang/site.tar.xz ] && [ "$(stat -c %s .dev/sglang/site.tar.xz)" -gt $((50 * 1048576)) ] \
    && hint="its site.tar.xz predates slim_site.sh: rm .dev/sglang/site.tar.xz and run this script again (~5 min)"
  echo "error: a device call would send $(mib "$total") MiB, over the 64 MiB limit ($parts); $hint" >&2; exit 2
fi
[ $((limit - total)) -ge $((6 * 1048576)) ] || echo "warning: under 6 MiB of headroom left below the 64 MiB limit" >&2
