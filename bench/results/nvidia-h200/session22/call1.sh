#!/usr/bin/env bash
# Session 22, call 1 (one H200): two patches prepared in session 21, timed same run.
#  - fp8 GQA's score product as e4m3 warpgroup MMAs (swap-AB, q split into two e4m3 parts
#    per row; session21/fp8-qk-wgmma.diff in .exp/fp8qk): its fp8 GPU tests on that tree,
#    then A/B against main (.exp/ab-ref) at the heuristic configs and at 2 stages / 64-token
#    tiles, with a bf16 control;
#  - head dim 64's finer split ladder (session21/gqa-d64-ladder.diff in .exp/d64): A/B at
#    the heuristic, and the recorded best (32 splits, no early reduce) timed beside it.
#   OUT=$OUT bash bench/results/nvidia-h200/session22/call1.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
ab() {  # name, timeout, ab_decode args...
  local name=$1 t=$2; shift 2
  echo "== $(date +%T) $name"
  timeout $t python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call1-$name.json \
    --rounds 3 --reps 30 "$@" > $OUT/call1-$name.txt 2>&1; echo "rc $?"
  tail -8 $OUT/call1-$name.txt | cut -c1-200
}
echo "== $(date +%T) fp8 GPU tests on .exp/fp8qk"
PYTHONPATH=/tmp/site:$PWD/.exp/fp8qk:$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider \
  -p no:warnings -m gpu tests/gpu/test_fp8_mtp_gpu.py tests/gpu/test_decode_attention_gpu.py \
  -k "fp8 or scale" > $OUT/call1-fp8qk-tests.txt 2>&1
echo "rc $?"; tail -3 $OUT/call1-fp8qk-tests.txt | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/call1-fp8qk-tests.txt | cut -c1-300 | head
F8='--case d128-b4:4,32,8,128,128,262144,fp8 --case d128-b64:64,32,8,128,128,8192,fp8
 --case d128-b8:8,32,8,128,128,32768,fp8 --case d64-b4:4,32,8,64,64,262144,fp8
 --case d256-b4:4,32,8,256,256,65536,fp8 --case bf16-d128-b4:4,32,8,128,128,262144'
ab fp8qk-heur 200 --cur-path .exp/fp8qk --config heuristic $F8
C='"num_warps": 4, "num_kv_splits": 8, "block_h": 16, "pdl": false, "merge": false'
ab fp8qk-s2 100 --cur-path .exp/fp8qk --config "{$C, \"block_n\": 128, \"num_stages\": 2}" \
  --case d128-b4:4,32,8,128,128,262144,fp8
ab fp8qk-n64 100 --cur-path .exp/fp8qk --config "{$C, \"block_n\": 64, \"num_stages\": 3}" \
  --case d128-b4:4,32,8,128,128,262144,fp8
ab d64-heur 120 --cur-path .exp/d64 --config heuristic --case d64-b1:1,32,8,64,64,32768 \
  --case d64-b1-128k:1,32,8,64,64,131072 --case d64-b4:4,32,8,64,64,32768
ab d64-s32 60 --cur-path .exp/ab-ref --case d64-b1:1,32,8,64,64,32768 --config \
  '{"num_warps": 4, "num_kv_splits": 32, "block_n": 128, "block_h": 16, "num_stages": 3, "pdl": false, "merge": false}'
echo "== $(date +%T) done"
