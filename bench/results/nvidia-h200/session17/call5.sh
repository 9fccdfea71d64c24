#!/usr/bin/env bash
# Session 17, call 5 (one H200): where the balanced grid's GQA cost at full context (call 4:
# head dim 64, b8 x 32k 1.061x, b4 x 262k 1.084x) comes from. Two same-run A/Bs against
# this tree (.exp/cur = `git archive HEAD kdispatch tools`): .exp/v-noexit (GQA stage 1
# without the empty split's early exit) and .exp/v-nobal (no balanced grid for GQA; the
# grid order and the exit kept); heuristic configs, no tables.
#   OUT=$OUT bash bench/results/nvidia-h200/session17/call5.sh
#   # carry [".whl", ".exp/cur", ".exp/v-noexit", ".exp/v-nobal", ".exp/ref-s17"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/ab.sqlite
C="--case d64-b8-32k:8,32,8,64,64,32768 --case d64-b4-262k:4,32,8,64,64,262144
   --case d64-b8-32k-rag:8,32,8,64,64,32768,rag --case d128-b8-32k:8,32,8,128,128,32768"
for v in v-noexit v-nobal ref-s17; do
  echo "== $(date +%T) cur vs $v"
  timeout 150 python3 tools/ab_decode.py --ref-path .exp/cur --cur-path .exp/$v $C --rounds 2 \
    --reps 15 --out $OUT/call5-ab-$v.json 2>&1 | tail -6
done
echo "== $(date +%T) done"
