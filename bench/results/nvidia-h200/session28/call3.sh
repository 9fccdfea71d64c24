#!/usr/bin/env bash
# Session 28, call 3 (one H200): on call 2's re-tune (decode hash c73780927efa89c3, every
# preset's decode keys, exported to db/nvidia-h200.json): the torch ops' GPU tests; the
# decode benchmark on the shipped table, the target shapes first (bf16 and fp8
# caches, one and two query tokens: fp8 / bf16 and two-token / one-token ratios of the
# same run); then FlashMLA beside kdispatch on the memory-bound and 128-head shapes, the
# work plan as a config beside the table's.
#   OUT=$OUT bash bench/results/nvidia-h200/session28/call3.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) torch ops GPU tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_torch_gpu.py \
  > $OUT/call3-gpu-tests.txt 2>&1
echo "rc $?"; tail -1 $OUT/call3-gpu-tests.txt | cut -c1-300
echo "== $(date +%T) decode bench ($SECONDS s in)"
timeout 250 python3 tools/bench_decode.py --max-cands 3 --time-limit 180 \
  --out $OUT/call3-decode.json 2>&1 | grep -v Warning | tail -45
left=$(( 570 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s left)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
timeout $(( left - 10 )) python3 tools/bench_flashmla.py --out $OUT/call3-flashmla.json --rounds 2 \
  --time-limit $(( left - 70 )) \
  --shapes kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-tp1-mla-b32-c16384 \
  --config "pl1={$G, \"num_kv_splits\": 1, \"plan\": true}" 2>&1 | grep -v Warning | tail -30
echo "== $(date +%T) done ($SECONDS s)"
