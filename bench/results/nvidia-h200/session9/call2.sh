#!/bin/bash
# session 9 call 2: GPU tests of the kernel round, guard A/B (3 trees), fp8 writer
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
unset TRITON_INTERPRET
mkdir -p /tmp/notables; export KDISPATCH_TABLE_DIR=/tmp/notables KDISPATCH_DB=sqlite:////tmp/ab.sqlite
echo "== $(date +%T) gpu tests"
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -p no:warnings tests/gpu --deselect tests/gpu/test_tune_gpu.py 2>&1 | tail -8 | tee $OUT/gpu-tests.txt
CASES="--case llama-b64:64,32,8,128,128,8192 --case llama-b4:4,32,8,128,128,262144 --case ds-b32:32,16,1,576,512,16384 --case kimi-b8:8,16,1,576,512,327600 --case dp128-b32:32,128,1,576,512,16384 --case kimi-b8-fp8:8,16,1,576,512,327600,fp8 --case llama-b4-fp8:4,32,8,128,128,262144,fp8 --case ds-b32-q2:32,16,1,576,512,16384,q2"
echo "== $(date +%T) A/B new vs noguard"
PYTHONPATH=/tmp/site timeout 230 python3 tools/ab_decode.py --ref-path .exp/ab-noguard --out $OUT/ab-noguard.json --rounds 3 --reps 20 $CASES --config heuristic 2>&1 | tail -14
echo "== $(date +%T) A/B new vs head (MLA)"
PYTHONPATH=/tmp/site timeout 120 python3 tools/ab_decode.py --ref-path .exp/ab-head --out $OUT/ab-head.json --rounds 3 --reps 20 --case ds-b32:32,16,1,576,512,16384 --case kimi-b8:8,16,1,576,512,327600 --case kimi-b8-fp8:8,16,1,576,512,327600,fp8 --case ds-b32-q2:32,16,1,576,512,16384,q2 --config heuristic 2>&1 | tail -8
echo "== $(date +%T) kv_write new"
PYTHONPATH=/tmp/site timeout 60 python3 tools/bench_kv_write.py --out $OUT/kv_write-new.json 2>&1 | tail -12
echo "== $(date +%T) kv_write head"
(cd .exp/ab-head && PYTHONPATH=/tmp/site OUT=$OUT timeout 60 python3 tools/bench_kv_write.py --out $OUT/kv_write-head.json 2>&1 | tail -6)
echo "== $(date +%T) done"
