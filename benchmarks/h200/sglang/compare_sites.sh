#!/usr/bin/env bash
# CPU check that a trimmed SGLang site tarball lost nothing the server start-up imports: unpack two
# tarballs, run site_imports.py against each and diff the outcomes, the files imported and the shared
# libraries loaded. Exit 0 when they agree, 1 when they differ (the differences are printed).
# Usage (repo root): bash benchmarks/h200/sglang/compare_sites.sh OLD.tar.xz NEW.tar.xz [WORKDIR]
# The tarballs hold CPython 3.12 builds; this machine has 3.11, so their compiled packages are replaced by
# cp311 wheels of the same pins (those of NEW stripped as slim_site.sh strips), and what the H200 image
# provides (torch, numpy, ...) comes from .venv, plus uvloop and nvidia-ml-py (on the image, not in .venv).
# Needs pip access to PyPI, xz, binutils; ~3 minutes on 2 cores. The CUDA-only steps fail alike on both.
set -euo pipefail
OLD=${1:?usage: compare_sites.sh OLD.tar.xz NEW.tar.xz [WORKDIR]}; NEW=${2:?usage: compare_sites.sh OLD.tar.xz NEW.tar.xz [WORKDIR]}
W=${3:-/tmp/dasc-compare-sites}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../../.." && pwd)
PY=$ROOT/.venv/bin/python; SP=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for f in "$OLD" "$NEW"; do [ -s "$f" ] || { echo "error: $f is not a tarball (expected a build_site.sh output)" >&2; exit 2; }; done
rm -rf "$W"; mkdir -p "$W"/old "$W"/new "$W"/whl "$W"/env "$W"/model
tar -C "$W/old" -xJf "$OLD"; tar -C "$W/new" -xJf "$NEW"
cp "$HERE/qwen3next-tiny.config.json" "$W/model/config.json"
# name==version of every distribution of OLD built for CPython 3.12 alone (not sglang: its Python runs on 3.11)
pins=$("$PY" - "$W/old" <<'EOF'
import pathlib, sys
for d in sorted(pathlib.Path(sys.argv[1]).glob("*.dist-info")):
    tags = [l.split(": ", 1)[1] for l in (d / "WHEEL").read_text().splitlines() if l.startswith("Tag: ")]
    meta = dict(l.split(": ", 1) for l in (d / "METADATA").read_text().splitlines()[:20] if ": " in l)
    if any(t.startswith(("cp312-cp312", "cp312-abi3")) for t in tags) and meta["Name"].lower() != "sglang":
        print(f'{meta["Name"]}=={meta["Version"]}')
EOF
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$W/whl" $pins uvloop==0.23.0 nvidia-ml-py==13.615.71 \
    2>&1 | grep -v "^WARNING" || true
python3 -m pip install -q --no-deps --no-compile --target "$W/ov-old" "$W"/whl/*.whl 2>&1 | grep -v "^WARNING" || true
cp -a "$W/ov-old" "$W/ov-new"; bash "$HERE/slim_site.sh" --strip-only "$W/ov-new"
for e in "$SP"/*; do
  n=$(basename "$e"); case $n in __pycache__|*.pth|__editable__*|dasc*) continue ;; esac
  [ -e "$W/old/$n" ] || [ -e "$W/ov-old/$n" ] || ln -s "$e" "$W/env/$n"
done
for v in old new; do
  PYTHONPATH=$W/ov-$v:$W/$v:$W/env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$PY" -S "$HERE/site_imports.py" "$W/$v" "$W/model" "$W/$v.json" > "$W/$v.log" 2>&1 &
done
wait
"$PY" - "$W" <<'EOF'
import json, sys
w = sys.argv[1]
old, new = (json.load(open(f"{w}/{v}.json")) for v in ("old", "new"))
bad = 0
for k in old["res"]:
    mark = "" if old["res"][k] == new["res"].get(k) else "  <-- DIFFERS: " + str(new["res"].get(k))
    bad += bool(mark)
    print(f"{k}: {old['res'][k][:110]}{mark}")
for key in ("files", "so", "warns"):
    lost, gained = sorted(set(old[key]) - set(new[key])), sorted(set(new[key]) - set(old[key]))
    print(f"{key}: {len(old[key])} old, {len(new[key])} new; only old {lost[:10]}; only new {gained[:10]}")
    bad += bool(lost or gained)
print("SAME" if not bad else f"DIFFERENT ({bad} differences)")
sys.exit(1 if bad else 0)
EOF
