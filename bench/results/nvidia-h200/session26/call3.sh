#!/usr/bin/env bash
# Session 26, call 3 (one H200): the device-side work plan of the Gluon MLA stage 1
# (plan=True, kdispatch/kernels/decode_attention/work_plan.py). Its GPU tests and the
# Gluon tile's; then tools/bench_flashmla.py with the plan at 1, 2, 4 and 8 items per SM
# share and the split grid at 1 and 2 splits, beside FlashMLA (call 2's build, carried).
#   OUT=$OUT bash bench/results/nvidia-h200/session26/call3.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) work plan and Gluon GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/gpu/test_work_plan_gpu.py \
  tests/gpu/test_gluon_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "rc $?"; grep -E "passed|failed|Error|error" $OUT/gpu-tests.txt | tail -5 | cut -c1-300
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
echo "== $(date +%T) bench_flashmla, plan sweep"
python3 tools/bench_flashmla.py --out $OUT/flashmla-plan.json --rounds 2 --time-limit 240 \
  --shapes deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-dp-ragged-b128-m32768,deepseek-v3-dp-ragged-b128-m8192,deepseek-v3-dp-ragged-b128-m16384-q2,deepseek-v3-tp1-mla-b32-c16384-q2,deepseek-v3-tp8-mla-b32-c16384-q2 \
  --config "p1={$G, \"num_kv_splits\": 1, \"plan\": true}" \
  --config "p2={$G, \"num_kv_splits\": 2, \"plan\": true}" \
  --config "p4={$G, \"num_kv_splits\": 4, \"plan\": true}" \
  --config "p8={$G, \"num_kv_splits\": 8, \"plan\": true}" \
  --config "s1={$G, \"num_kv_splits\": 1}" \
  --config "s2={$G, \"num_kv_splits\": 2}" 2>&1 | grep -v Warning
echo "== $(date +%T) done"
