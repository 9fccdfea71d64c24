#!/usr/bin/env bash
# Session 29, call 4 (one H200): the plan charging a segment's fixed cost between requests
# (SEG_COST = 5 tiles; calls 1-2 measured ~12 us a segment against ~2.2 us a tile, and the
# programs of more segments ending last), with the split path's q through _load_q and the
# pn clamp in one statement (decode hash bbf50e37e139dbfb). The Gluon and plan GPU tests
# (decode, Gluon tile, work plan, fp8 / multi-token), then the same-run A/B against the
# tree before (c527991) on the plan and the table's configs: 128 heads ragged b128 (means
# 16,384 and 4,096) and full context b32 x 16,384, 64-token pages.
#   OUT=$OUT bash bench/results/nvidia-h200/session29/call4.sh
#   # carry [".whl", ".exp/ab-ref"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) decode GPU tests"
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gluon_gpu.py \
  tests/gpu/test_decode_attention_gpu.py tests/gpu/test_work_plan_gpu.py \
  tests/gpu/test_fp8_mtp_gpu.py > $OUT/call4-gpu-tests.txt 2>&1
rc=$?; echo "rc $rc"; tail -3 $OUT/call4-gpu-tests.txt | cut -c1-400
echo "== $(date +%T) A/B against c527991 ($SECONDS s in)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
timeout $(( 585 - SECONDS )) python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call4-ab-plan.json --rounds 3 \
  --case rag-b128:128,128,1,576,512,32768,rag,p64 --case rag-b128-4k:128,128,1,576,512,8192,rag,p64 \
  --case full-b32:32,128,1,576,512,16384,p64 \
  --config "{$G, \"num_kv_splits\": 1, \"plan\": true}" --config heuristic 2>&1 | grep -v Warning | tail -20
echo "== $(date +%T) done ($SECONDS s)"
