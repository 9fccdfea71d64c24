#!/usr/bin/env bash
# Session 13, call 3 (one H200): tune-throughput-2 brought back (the revert of its revert,
# /work/h2 at 2444c41 -> .exp/ref-tt3, with tests) against main (.exp/ref-main13t): the
# tuner's GPU test on the brought-back tree, then `tools/bench_tune.sh ahead-6` (llama3-8b,
# 6 candidates per key, cuda:0, empty Triton cache, fresh SQLite) alternated main, tt3,
# main, tt3. Results packed into $OUT/call3.tgz.
#   OUT=$OUT bash bench/results/nvidia-h200/session13/call3.sh      # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
FINAL=$OUT; RAW=/tmp/call3; mkdir -p $RAW
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
echo "== $(date +%T) GPU test of ref-tt3"
(cd .exp/ref-tt3 && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider \
  -p no:warnings tests/gpu/test_tune_gpu.py 2>&1 | tail -4)
for r in 1 2; do
  for t in ref-main13t ref-tt3; do
    echo "== $(date +%T) ahead-6 $t round $r"
    (cd .exp/$t && OUT=$RAW/$t-r$r timeout 110 bash tools/bench_tune.sh ahead-6 2>&1 | tail -4)
  done
done
tar czf $FINAL/call3.tgz -C $RAW .
echo "== $(date +%T) done"
