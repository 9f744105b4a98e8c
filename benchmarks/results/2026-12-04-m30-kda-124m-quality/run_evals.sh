set -x  # session 29 (2026-12-04), from the repo root; I: the initial model (benchmarks.train.init_model); 2 CPU cores
export OMP_NUM_THREADS=1
PY=.venv-newest/bin/python
B=plans/reference/kda-hybrid-30m-sharegpt; I=.dev/train/m30k/init; E=.dev/train/m30k/eval124; Q=/tmp/q30k
mkdir -p $Q $E
for w in 16 64 128 256; do $PY cli.py compile $B --wmax $w --out $Q/kda-w$w.dasc --no-kernels -q || exit 1; done
PLANS="--plan $Q/kda-w16.dasc --plan $Q/kda-w64.dasc --plan $Q/kda-w128.dasc --plan $Q/kda-w256.dasc"
A="--arms dense,nr,wr,random,init,untrained --init-from $I --suffix-len 64 --gen-tokens 16"
date
$PY cli.py eval $B $PLANS $A --sharegpt 24 --retrieval 6 --prefix-len 512 --json $E/kda-512.json --plot $E/kda-512.png > $E/e512.log 2>&1 &
$PY cli.py eval $B $PLANS $A --sharegpt 12 --retrieval 4 --prefix-len 2048 --json $E/kda-2048.json --plot $E/kda-2048.png > $E/e2048.log 2>&1 &
wait; date
$PY cli.py eval $B $PLANS $A --sharegpt 24 --retrieval 6 --prefix-len 512 --sharegpt-offset 1000 --seed 1 --json $E/kda-512-d1.json --plot $E/kda-512-d1.png > $E/e512d1.log 2>&1 &
$PY cli.py eval $B --horizons --sharegpt 32 --prefix-len 1024 --init-from $I --json $E/kda-horizons.json > $E/hz.log 2>&1
# once the horizons were done (the session started this one by hand, beside the running 512 eval):
$PY cli.py eval $B $PLANS $A --sharegpt 12 --retrieval 4 --prefix-len 2048 --sharegpt-offset 1000 --seed 1 --json $E/kda-2048-d1.json --plot $E/kda-2048-d1.png > $E/e2048d1.log 2>&1 &
wait; date; echo ALLDONE
# a third draw, run after the tables above were read (the pairings against init were weak):
$PY cli.py eval $B $PLANS $A --sharegpt 24 --retrieval 0 --prefix-len 512 --sharegpt-offset 1500 --seed 2 --json $E/kda-512-d2.json --plot $E/kda-512-d2.png > $E/e512d2.log 2>&1
