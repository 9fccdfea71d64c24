#!/usr/bin/env bash
# Session 23, call 8 (one H200): a prepared next step, timed only (not landed: no device
# time is left to re-tune). The seesaw with each tile copied in 64-column blocks, each
# block completing a ready mbarrier of its own, and the score MMA issued block by block
# as they land (.exp/stream: session23/seesaw-blocks.diff on this tree; the seesaw at
# every bf16 page size) against this tree (the seesaw at 64-token pages only). Every
# output checked against the fp32 reference first (ragged lengths: odd tile counts).
#   OUT=$OUT bash bench/results/nvidia-h200/session23/call8.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl || exit 1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
export PYTHONPATH=/tmp/site:$PWD
G='{"kernel": "gluon", "num_kv_splits": 2, "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2}'
timeout 200 python3 tools/ab_decode.py --ref-path . --cur-path .exp/stream \
  --out $OUT/call8-ab.json --rounds 3 --reps 20 --config "$G" \
  --case h128-p64:32,128,1,576,512,16384,p64 --case h128-p16:32,128,1,576,512,16384 \
  --case h16q2-p16:32,16,1,576,512,16384,q2 --case rag128-p64:128,128,1,576,512,32768,rag,p64 \
  --case rag128-p16:128,128,1,576,512,32768,rag > $OUT/call8-ab.txt 2>&1; echo "rc $?"
tail -7 $OUT/call8-ab.txt | cut -c1-200
