#!/usr/bin/env bash
# The CPU A/B of session 27 (benchmarks/notes/2026-12-04-m30-gdn-100m.md, "--skip-source-loss on the CPU"):
# the 31M GDN bundle rebuilt as a trainer checkpoint, then two 40-step stages side by side, one core each, that
# differ only in --skip-source-loss; then copy checks and the attention probe on both. ~20 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
W=${W:-/tmp/skip}
export DASC_COMMIT=$(git rev-parse HEAD)     # recorded in each session (the run of 2026-12-04 recorded "unknown")
# the 100.0M-token bundle this ran from; plans/reference/gdn-hybrid-30m-sharegpt holds the 126.0M model since session 28
B=$W/bundle-100m
[ -d $B ] || { mkdir -p $B && git archive 91645db plans/reference/gdn-hybrid-30m-sharegpt | tar -x -C $B --strip-components 3; }
[ -d $W/resume/gdn ] || .venv/bin/python -m benchmarks.train.from_bundle $B --out $W/resume
for arm in skip plain; do
  flag=""; [ $arm = skip ] && flag="--skip-source-loss"
  OMP_NUM_THREADS=1 PYTHONPATH=. taskset -c $([ $arm = skip ] && echo 0 || echo 1) .venv/bin/python -m benchmarks.train.train \
    --family gdn --data .dev/train/prep --out $W/$arm --resume $W/resume/gdn --stage-tokens 81920 --seq 256 --batch 8 \
    --recall-frac 1.0 --lr 1e-3 --warmup 5 --cooldown 0.01 --max-steps 40 --device cpu --no-decay-report \
    --log-every 10 $flag > $W/$arm.log 2>&1 &
done
wait
OMP_NUM_THREADS=2 .venv/bin/python benchmarks/results/2026-12-04-m30-gdn-recall-fixed-rows/copy_checks.py $W/skip/gdn $W/plain/gdn
for arm in skip plain; do
  OMP_NUM_THREADS=2 .venv-newest/bin/python -m benchmarks.train.attention_probe $W/$arm/gdn --json $W/probe-$arm.json
done
