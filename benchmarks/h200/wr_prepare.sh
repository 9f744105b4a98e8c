#!/usr/bin/env bash
# Build .dev/wr for benchmarks/h200/wr_smoke.sh from one commit (default HEAD), so the device call runs
# known code whatever else the working tree holds: a dasc wheel of that commit's packaged folders and
# that commit's wr_smoke.sh, wr_smoke_client.py and smoke_model.py. Also copies run_sglang.sh and the
# tiny config into .dev/sglang (the SGLang tarball there comes from prepare_carry.sh). Prints the bytes
# a call would send (tracked + untracked-not-ignored files + .dev/sglang + .dev/wr; limit 64 MiB).
set -euo pipefail
REV=${1:-HEAD}
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git archive "$REV" | tar -x -C "$tmp"
rm -rf .dev/wr && mkdir -p .dev/wr .dev/sglang
"$PY" -m pip wheel -q --no-deps -w .dev/wr "$tmp"
for f in wr_smoke.sh wr_smoke_client.py smoke_model.py; do cp "$tmp/benchmarks/h200/$f" .dev/wr/; done
cp "$tmp/benchmarks/h200/sglang/run_sglang.sh" "$tmp/benchmarks/h200/sglang/qwen3next-tiny.config.json" .dev/sglang/
git rev-parse "$REV" > .dev/wr/COMMIT
sizes() { "$PY" -c 'import os, sys; print(sum(os.path.getsize(p) for p in sys.stdin.read().split("\0") if p and os.path.isfile(p)))'; }
tree=$(git ls-files -z --cached --others --exclude-standard | sizes)
carried=$(find .dev/sglang .dev/wr -type f -print0 | sizes)
echo "commit $(cat .dev/wr/COMMIT): tree $tree + carried $carried = $((tree + carried)) bytes (limit $((64 * 1024 * 1024)))"
