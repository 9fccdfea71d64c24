#!/usr/bin/env bash
# Session 26, call 5 (one H200, call 4's machine still warm): on call 4's exported table
# (copied into db/ here): the Gluon, work plan and decode GPU tests, then
# tools/bench_flashmla.py on the issue's MLA shapes (the peer: call 2's build, carried).
#   OUT=$OUT bash bench/results/nvidia-h200/session26/call5.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION", "db/nvidia-h200.json"]
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) GPU tests"
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_work_plan_gpu.py \
  tests/gpu/test_gluon_gpu.py tests/gpu/test_decode_attention_gpu.py > $OUT/call5-gpu-tests.txt 2>&1
echo "rc $?"; tail -2 $OUT/call5-gpu-tests.txt | cut -c1-300
left=$(( 560 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
python3 tools/bench_flashmla.py --out $OUT/call5-flashmla.json --rounds 3 --time-limit $(( left - 60 )) \
  --shapes deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-dp-ragged-b128-m8192,deepseek-v3-dp-ragged-b128-m32768,deepseek-v3-tp8-mla-b32-c16384,deepseek-v3-tp8-mla-b32-c16384-q2,kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b8-c327600,kimi-k3-mla-b1-c65536,deepseek-v3-dp-ragged-b128-m16384-q2,deepseek-v3-tp1-mla-b32-c16384-q2 \
  --config "p4={$G, \"num_kv_splits\": 4, \"plan\": true}" 2>&1 | grep -v Warning
echo "== $(date +%T) done"
