set -x  # session 24, from the repo root; I: the initial model (benchmarks.train.init_model)
export OMP_NUM_THREADS=1
PY=.venv-newest/bin/python
B=plans/reference/gdn-hybrid-30m-sharegpt; I=.dev/train/m30/init; E=.dev/train/m30/eval100; Q=/tmp/q30b
# B held the 100.0M-token model until session 28 (the 126.0M one since): to re-run, take it from git first
if [ "$(git rev-parse HEAD:$B/train_log.json)" != "$(git rev-parse 91645db:$B/train_log.json)" ]; then
  B=/tmp/gdn30-100m; [ -d $B ] || { mkdir -p $B && git archive 91645db plans/reference/gdn-hybrid-30m-sharegpt | tar -x -C $B --strip-components 3; }
fi
mkdir -p $Q
for w in 16 64 128 256; do $PY cli.py compile $B --wmax $w --out $Q/gdn-w$w.dasc --no-kernels -q || exit 1; done
PLANS="--plan $Q/gdn-w16.dasc --plan $Q/gdn-w64.dasc --plan $Q/gdn-w128.dasc --plan $Q/gdn-w256.dasc"
A="--arms dense,nr,wr,random,init,untrained --init-from $I --suffix-len 64 --gen-tokens 16"
date
$PY cli.py eval $B $PLANS $A --sharegpt 32 --retrieval 16 --prefix-len 512 --json $E/gdn-512.json --plot $E/gdn-512.png > $E/e512.log 2>&1 &
$PY cli.py eval $B $PLANS $A --sharegpt 24 --retrieval 12 --prefix-len 2048 --json $E/gdn-2048.json --plot $E/gdn-2048.png > $E/e2048.log 2>&1 &
wait; date
$PY cli.py eval $B $PLANS $A --sharegpt 32 --retrieval 16 --prefix-len 512 --sharegpt-offset 1000 --seed 1 --json $E/gdn-512-d1.json --plot $E/gdn-512-d1.png > $E/e512d1.log 2>&1 &
$PY cli.py eval $B $PLANS $A --sharegpt 24 --retrieval 12 --prefix-len 2048 --sharegpt-offset 1000 --seed 1 --json $E/gdn-2048-d1.json --plot $E/gdn-2048-d1.png > $E/e2048d1.log 2>&1 &
wait; date
$PY cli.py eval $B --horizons --sharegpt 32 --prefix-len 1024 --init-from $I --json $E/gdn-horizons.json > $E/hz.log 2>&1
date; echo ALLDONE
