#!/usr/bin/env bash
# Session 17, call 3 (one H200): with call 2's table shipped, the Performance page's shapes
# on the balanced grid: bf16 with each shape's length twin (ragged lengths around half
# the context for a full-context shape, full context for the ragged 128-head batch), then
# the fp8 and two-token rows; then the device-or-interpreter decode tests on the GPU
# (call 1 cut them at 60 s).
#   OUT=$OUT bash bench/results/nvidia-h200/session17/call3.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
S=kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384,llama3-8b-gqa-long,llama3-8b-gqa-b8-c32768,llama3-8b-gqa-b64-c8192,deepseek-v3-tp1,ragged-b128-m16384
echo "== $(date +%T) decode bf16 + twins"
timeout 240 python3 tools/bench_decode.py --max-cands 2 --time-limit 200 --twins --kv bf16 --q-len 1 \
  --shapes $S --out $OUT/call3-decode-bf16.json 2>&1 | tail -22
echo "== $(date +%T) decode fp8"
timeout 120 python3 tools/bench_decode.py --max-cands 2 --time-limit 90 --kv fp8 --q-len 1 \
  --shapes kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384,llama3-8b-gqa-long,llama3-8b-gqa-b64-c8192 \
  --out $OUT/call3-decode-fp8.json 2>&1 | tail -12
echo "== $(date +%T) decode two tokens"
timeout 70 python3 tools/bench_decode.py --max-cands 2 --time-limit 40 --kv bf16 --q-len 2 \
  --shapes deepseek-v3-tp8-mla-b32-c16384,deepseek-v3-tp1 --out $OUT/call3-decode-q2.json 2>&1 | tail -8
echo "== $(date +%T) decode tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
  tests/kernels/test_decode_balance.py tests/kernels/test_decode_attention.py \
  tests/kernels/test_decode_multitoken.py tests/kernels/test_decode_fp8.py \
  > $OUT/call3-kernel-tests.txt 2>&1; echo "rc $?"; tail -3 $OUT/call3-kernel-tests.txt
echo "== $(date +%T) done"
