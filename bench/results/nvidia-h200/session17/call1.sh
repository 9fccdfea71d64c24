#!/usr/bin/env bash
# Session 17, call 1 (one H200): the balanced split grid on main's working tree (split as
# the slowest grid axis, empty splits leave before their loads). A same-run A/B of the
# heuristic configs against session 16's kernels (.exp/ref-s17 =
# `git archive ca08c55 kdispatch tools`), no tables on either side, on full-context and
# ragged lengths (N(context/2, context/4)); the cases of session 16's calls 2 and 3 and two
# multi-token MLA cases (fp8 and bf16); then every GPU test.
#   OUT=$OUT bash bench/results/nvidia-h200/session17/call1.sh   # carry [".whl", ".exp/ref-s17"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site
echo "== $(date +%T) A/B"
mkdir -p /tmp/no-tables
C=""
for c in tp1-b32:32,128,1,576,512,16384 tp8-b32:32,16,1,576,512,16384 \
         kimi-b8:8,12,1,576,512,327600 llama-b8-32k:8,32,8,128,128,32768 \
         llama-b64-8k:64,32,8,128,128,8192 llama-b8-131k:8,32,8,128,128,131072 \
         llama-b8-4k:8,32,8,128,128,4096 dp-b128:128,128,1,576,512,32768 \
         fp8-q2-b8:8,16,1,576,512,16384,fp8,q2 q2-b32:32,16,1,576,512,16384,q2; do
  C="$C --case $c"; [ "${c%%:*}" = llama-b8-4k ] || C="$C --case ${c%%:*}-rag:${c#*:},rag"
done
KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/ab.sqlite \
  timeout ${AB_SECONDS:-320} python3 tools/ab_decode.py --ref-path .exp/ref-s17 $C --rounds 2 \
  --reps 15 --out $OUT/call1-ab.json 2>&1 | tail -20
echo "== $(date +%T) gpu tests"
(export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
 timeout ${TEST_SECONDS:-190} python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
   tests tests/torch tests/test_memory_safety.py > $OUT/call1-gpu-tests.txt 2>&1; echo "rc $?"
 timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
   tests/kernels/test_decode_balance.py tests/kernels/test_decode_attention.py \
   tests/kernels/test_decode_multitoken.py tests/kernels/test_decode_fp8.py \
   > $OUT/call1-kernel-tests.txt 2>&1; echo "rc $?")
tail -8 $OUT/call1-gpu-tests.txt; tail -4 $OUT/call1-kernel-tests.txt
echo "== $(date +%T) done"
