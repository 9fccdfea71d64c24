#!/bin/bash
# session 9 call 3: the page guard's same-run A/B (GPU 0) beside the full re-tune of the new kernels (GPU 1)
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
unset TRITON_INTERPRET
mkdir -p /tmp/notables
CASES="--case llama-b64:64,32,8,128,128,8192 --case llama-b8:8,32,8,128,128,65536 --case ds-b32:32,16,1,576,512,16384 --case kimi-b8:8,16,1,576,512,327600 --case kimi-b8-fp8:8,16,1,576,512,327600,fp8 --case dp128-b32:32,128,1,576,512,16384"
( sleep 15; CUDA_VISIBLE_DEVICES=0 KDISPATCH_TABLE_DIR=/tmp/notables KDISPATCH_DB=sqlite:////tmp/ab.sqlite PYTHONPATH=/tmp/site \
  timeout 330 python3 tools/ab_decode.py --ref-path .exp/ab-noguard --out $OUT/ab-noguard.json --rounds 2 --reps 15 $CASES --config heuristic > $OUT/ab-noguard.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 STATE=/tmp/st BASE_DB=bench/results/nvidia-h200/session8/h200.sqlite TUNE_MINUTES=4.3 MAX_CANDS=60 \
  timeout 420 bash tools/gpu_session.sh tune > $OUT/tune-call.txt 2>&1 ) &
wait
tail -12 $OUT/ab-noguard.txt
tail -20 $OUT/tune-call.txt
