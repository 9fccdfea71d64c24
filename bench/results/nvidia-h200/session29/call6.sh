#!/usr/bin/env bash
# Session 29, call 6 (one H200), on call 5's re-tuned table (decode hash bbf50e37e139dbfb,
# exported to db/nvidia-h200.json): the GPU tests of the torch ops, the native launch
# cache, the memo guard, the GPU tune and memory safety; then FlashMLA beside kdispatch in
# three alternating rounds on the ragged 128-head batches (means 4,096, 16,384, 32,768) and
# full context b32 x 16,384, the plan as a config beside the table's.
#   OUT=$OUT bash bench/results/nvidia-h200/session29/call6.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) GPU tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/gpu/test_native_gpu.py \
  tests/gpu/test_memo_guard_gpu.py tests/gpu/test_tune_gpu.py tests/test_memory_safety.py \
  tests/torch > $OUT/call6-gpu-tests.txt 2>&1
echo "rc $?"; tail -2 $OUT/call6-gpu-tests.txt | cut -c1-300
left=$(( 370 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s left)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
timeout $(( left - 5 )) python3 tools/bench_flashmla.py --out $OUT/call6-flashmla.json --rounds 3 \
  --time-limit $(( left - 60 )) \
  --shapes deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m32768 \
  --config "pl1={$G, \"num_kv_splits\": 1, \"plan\": true}" 2>&1 | grep -v Warning | tail -20
echo "== $(date +%T) done ($SECONDS s)"
