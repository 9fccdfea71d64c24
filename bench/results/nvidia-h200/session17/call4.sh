#!/usr/bin/env bash
# Session 17, call 4 (one H200): the GQA keys where session 17's tune (call 2) put the
# heuristic 3-8% behind its best, as a same-run A/B of the heuristic configs against
# session 16's kernels (.exp/ref-s17 = `git archive ca08c55 kdispatch tools`), no tables,
# every request at full context (the tuner's lengths); then the device-or-interpreter
# decode tests on the GPU in 8 workers (calls 1 and 3 cut them at 60 and 100 s).
#   OUT=$OUT bash bench/results/nvidia-h200/session17/call4.sh   # carry [".whl", ".exp/ref-s17"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site
echo "== $(date +%T) A/B"
mkdir -p /tmp/no-tables
KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/ab.sqlite \
  timeout 200 python3 tools/ab_decode.py --ref-path .exp/ref-s17 --rounds 3 --reps 15 \
  --case d64-b1-32k:1,32,8,64,64,32768 --case d64-b8-32k:8,32,8,64,64,32768 \
  --case d64-b4-262k:4,32,8,64,64,262144 --case d96-b8-4k:8,55,55,96,96,4096 \
  --case d128-b1-32k:1,32,8,128,128,32768 --case d256-fp8-b64-32k:64,16,8,256,256,32768,fp8 \
  --out $OUT/call4-ab.json 2>&1 | tail -10
echo "== $(date +%T) decode tests"
(export PYTHONPATH=/tmp/site:$PWD
 timeout 280 python3 -m pytest -q -n 8 -p no:cacheprovider -p no:warnings \
   tests/kernels/test_decode_balance.py tests/kernels/test_decode_attention.py \
   tests/kernels/test_decode_multitoken.py tests/kernels/test_decode_fp8.py \
   > $OUT/call4-kernel-tests.txt 2>&1; echo "rc $?"); tail -4 $OUT/call4-kernel-tests.txt
echo "== $(date +%T) done"
