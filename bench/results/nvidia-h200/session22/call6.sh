#!/usr/bin/env bash
# Session 22, call 6 (one H200): a seesaw draft of the Gluon MLA tile (.exp/seesaw; not
# landed): warpgroup 0 scores the even tile of each pair and holds O's left 256 columns,
# warpgroup 1 the odd tile and the right columns; P and the row max pass between them
# through shared memory, so one warpgroup's softmax runs under the other's MMAs. A/B
# against the landed copy-warp kernel (.exp/ab-ref), bf16, Gluon at 2 splits; every output
# is checked against the fp32 reference first (ragged lengths: odd tile counts, tails).
#   OUT=$OUT bash bench/results/nvidia-h200/session22/call6.sh   # carry [".whl", ".exp"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
G='{"kernel": "gluon", "num_kv_splits": 2, "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2}'
timeout 200 python3 tools/ab_decode.py --ref-path .exp/ab-ref --cur-path .exp/seesaw \
  --out $OUT/call6-ab.json --rounds 3 --reps 20 --config "$G" \
  --case h128-p64:32,128,1,576,512,16384,p64 --case h128-p16:32,128,1,576,512,16384 \
  --case rag128-p64:128,128,1,576,512,32768,rag,p64 --case h16q2-p16:32,16,1,576,512,16384,q2 \
  > $OUT/call6-ab.txt 2>&1; echo "rc $?"
tail -8 $OUT/call6-ab.txt | cut -c1-300
echo "== $(date +%T) done"
