#!/usr/bin/env bash
# Session 21, call 5 (one H200): where the next tile's copies go, same-run A/B. The tree
# (ref: the copies right after the score MMA's issue, from ids loaded a tile ahead) against
# .exp/ab-var (cur: the same copies at the top of the tile, before the stage's wait, as
# before session 21 but with the ids loaded a tile ahead). Not landed either way this
# session (a kernel change needs a re-tune): a record for the next one.
# .exp/ab-var: a copy of kdispatch/ with call5-var.diff applied.
#   OUT=$OUT bash bench/results/nvidia-h200/session21/call5.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
G2='{"kernel": "gluon", "num_kv_splits": 2, "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2}'
timeout 280 python3 tools/ab_decode.py --ref-path . --cur-path .exp/ab-var \
  --out $OUT/call5-ab.json --rounds 3 --reps 30 --config "$G2" \
  --case h128-p16:32,128,1,576,512,16384 --case h128-p64:32,128,1,576,512,16384,p64 \
  --case h128-p64-fp8:32,128,1,576,512,16384,fp8,p64 --case h16q2-p16:32,16,1,576,512,16384,q2 \
  > $OUT/call5-ab.txt 2>&1; echo "rc $?"
tail -12 $OUT/call5-ab.txt | cut -c1-220
