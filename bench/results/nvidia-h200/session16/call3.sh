#!/usr/bin/env bash
# Session 16, call 3 (one H200): the balanced grid with 2x headroom and no balance for a
# Triton split count of 1 (.exp/bal-r2 = `git archive balance-grid kdispatch tools` with
# BALANCE_HEADROOM = 2 and that rule) against main's kernels (.exp/ref-s16), the same
# cases as call 2, heuristic configs, no tables.
#   OUT=$OUT bash bench/results/nvidia-h200/session16/call3.sh
#   # carry [".whl", ".exp/ref-s16", ".exp/bal-r2"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/ab.sqlite
C=""
for c in tp1-b32:32,128,1,576,512,16384 tp8-b32:32,16,1,576,512,16384 \
         kimi-b8:8,12,1,576,512,327600 llama-b8-32k:8,32,8,128,128,32768 \
         llama-b64-8k:64,32,8,128,128,8192 llama-b8-131k:8,32,8,128,128,131072 \
         llama-b8-4k:8,32,8,128,128,4096 dp-b128:128,128,1,576,512,32768; do
  C="$C --case $c"; [ "${c%%:*}" = llama-b8-4k ] || C="$C --case ${c%%:*}-rag:${c#*:},rag"
done
timeout 300 python3 tools/ab_decode.py --ref-path .exp/ref-s16 --cur-path .exp/bal-r2 $C \
  --rounds 2 --reps 15 --out $OUT/call3-ab-r2.json 2>&1 | tail -20
