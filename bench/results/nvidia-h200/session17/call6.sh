#!/usr/bin/env bash
# Session 17, call 6 (one H200): the balanced grid's headroom. Call 5 put its GQA cost at
# full context (head dim 64: 0.90x the time without it) in the grid itself, not in the
# empty splits' exit; here this tree (.exp/cur, 2x the config's splits) against 1.5x
# (.exp/h150) and 1.25x (.exp/h125), full-context and ragged cases, heuristic configs.
#   OUT=$OUT bash bench/results/nvidia-h200/session17/call6.sh
#   # carry [".whl", ".exp/cur", ".exp/h150", ".exp/h125", ".exp/v-nobal"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/ab.sqlite
C="--case d64-b8-32k:8,32,8,64,64,32768 --case d64-b8-32k-rag:8,32,8,64,64,32768,rag
   --case d64-b4-262k:4,32,8,64,64,262144 --case d64-b4-262k-rag:4,32,8,64,64,262144,rag
   --case llama-b8-32k-rag:8,32,8,128,128,32768,rag --case kimi-b8-rag:8,12,1,576,512,327600,rag
   --case tp8-b32:32,16,1,576,512,16384 --case tp8-b32-rag:32,16,1,576,512,16384,rag"
for v in h150 h125 v-nobal; do
  echo "== $(date +%T) cur vs $v"
  timeout 160 python3 tools/ab_decode.py --ref-path .exp/cur --cur-path .exp/$v $C --rounds 2 \
    --reps 15 --out $OUT/call6-ab-$v.json 2>&1 | tail -10
done
echo "== $(date +%T) done"
