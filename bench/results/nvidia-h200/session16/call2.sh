#!/usr/bin/env bash
# Session 16, call 2 (one H200), on branch balance-grid: the balanced split grid. Every GPU test, then a same-run
# A/B of the heuristic configs against session 15's kernels (.exp/ref-s16 =
# `git archive 0c0377b kdispatch tools`), no tables on either side, on full-context and
# ragged lengths (N(context/2, context/4)).
#   OUT=$OUT bash bench/results/nvidia-h200/session16/call2.sh   # carry [".whl", ".exp/ref-s16"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site
echo "== $(date +%T) gpu tests"
(export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
 timeout ${TEST_SECONDS:-230} python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
   tests tests/torch tests/test_memory_safety.py > $OUT/call2-gpu-tests.txt 2>&1; echo "rc $?")
tail -6 $OUT/call2-gpu-tests.txt
echo "== $(date +%T) A/B"
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/ab.sqlite
C=""
for c in tp1-b32:32,128,1,576,512,16384 tp8-b32:32,16,1,576,512,16384 \
         kimi-b8:8,12,1,576,512,327600 llama-b8-32k:8,32,8,128,128,32768 \
         llama-b64-8k:64,32,8,128,128,8192 llama-b8-131k:8,32,8,128,128,131072 \
         llama-b8-4k:8,32,8,128,128,4096 dp-b128:128,128,1,576,512,32768; do
  C="$C --case $c"; [ "${c%%:*}" = llama-b8-4k ] || C="$C --case ${c%%:*}-rag:${c#*:},rag"
done
timeout ${AB_SECONDS:-300} python3 tools/ab_decode.py --ref-path .exp/ref-s16 $C --rounds 2 \
  --reps 15 --out $OUT/call2-ab.json 2>&1 | tail -20
echo "== $(date +%T) done"
