#!/usr/bin/env bash
# Session 29, call 7 (one H200): call 6 had the 128-head b32 x 16,384 batch at 16-token
# pages 8% slower than session 28's figure (302.4 vs 280.2 us; FlashMLA the same). Same-run
# A/B of this tree against the tree before the session's kernel changes (c527991) at fixed
# Gluon configs: 128 heads at 16-token pages (2 splits), 16 heads x 2 tokens (4 splits),
# 128 heads fp8 at 64-token pages (2 splits).
#   OUT=$OUT bash bench/results/nvidia-h200/session29/call7.sh
#   # carry [".whl", ".exp/ab-ref"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
timeout 200 python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call7-ab-split.json --rounds 3 \
  --case tp1-p16:32,128,1,576,512,16384 --case tp1-fp8-p64:32,128,1,576,512,16384,fp8,p64 \
  --config "{$G, \"num_kv_splits\": 2}" 2>&1 | grep -v Warning | tail -8
timeout 100 python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call7-ab-q2.json --rounds 3 \
  --case tp8-q2:32,16,1,576,512,16384,q2 --config "{$G, \"num_kv_splits\": 4}" 2>&1 | grep -v Warning | tail -4
echo "== $(date +%T) done ($SECONDS s)"
