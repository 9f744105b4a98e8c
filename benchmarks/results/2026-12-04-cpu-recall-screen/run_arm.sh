#!/bin/bash
# usage: run_arm.sh ARM STEPS [extra train.py flags...]   (one core, core 1)
cd /work/main
ARM=$1; STEPS=$2; shift 2
SEQ=256; BATCH=16
for ((i=1;i<=$#;i++)); do if [ "${!i}" = "--seq" ]; then j=$((i+1)); SEQ=${!j}; fi; done
TOT=$((STEPS*SEQ*BATCH))
mkdir -p .dev/recall-cpu/$ARM
DRIVER="-m benchmarks.train.train"
[ -n "$WRAP" ] && DRIVER=".dev/recall-cpu/$WRAP"
echo "$(date -u +%FT%T) start $ARM steps=$STEPS tot=$TOT flags: $*" >> .dev/recall-cpu/arms.txt
/usr/bin/time -f "wall %e s" env PYTHONPATH=. OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 1 .venv/bin/python $DRIVER \
  --family gdn --size smoke --seed 0 --data .dev/train/prep --device cpu --out .dev/recall-cpu/$ARM \
  --seq $SEQ --batch $BATCH --log-every 50 --max-steps $STEPS --warmup 50 --total-tokens $TOT \
  --exact-state --no-decay-report "$@" > .dev/recall-cpu/$ARM/stdout.log 2>&1
echo "$(date -u +%FT%T) end $ARM rc=$?" >> .dev/recall-cpu/arms.txt
