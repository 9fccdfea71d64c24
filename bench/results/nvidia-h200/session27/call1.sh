#!/usr/bin/env bash
# Session 27, call 1 (one H200): the work plan as persistent programs over equal parts
# (plan=True; the decode source hash changed, the table is stale until call 2's re-tune).
# GPU tests of the plan and the Gluon tile (whose partitions now take the plan's segment
# loop), a same-run A/B of the Gluon tile without the plan against the last commit's
# kernels (.exp/ab-ref = git archive 04aa9c8), and tools/bench_flashmla.py on the ragged
# 128-head batches with the plan at 1 and 2 programs per SM share.
#   OUT=$OUT bash bench/results/nvidia-h200/session27/call1.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION", ".exp/ab-ref"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) GPU tests"
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/gpu/test_work_plan_gpu.py \
  tests/gpu/test_gluon_gpu.py > $OUT/call1-gpu-tests.txt 2>&1
echo "rc $?"; tail -3 $OUT/call1-gpu-tests.txt | cut -c1-400
echo "== $(date +%T) A/B without the plan ($SECONDS s in)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
timeout 120 python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call1-ab.json --rounds 2 \
  --case tp1-p64:32,128,1,576,512,16384,p64 --case tp8-q2:32,16,1,576,512,16384,q2 \
  --config "{$G, \"num_kv_splits\": 2}" 2>&1 | grep -v Warning | tail -6
left=$(( 560 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s)"
python3 tools/bench_flashmla.py --out $OUT/call1-flashmla.json --rounds 2 --time-limit $(( left - 40 )) \
  --shapes deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-dp-ragged-b128-m32768,deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m8192,deepseek-v3-dp-ragged-b128-m16384-q2 \
  --config "pl1={$G, \"num_kv_splits\": 1, \"plan\": true}" \
  --config "pl2={$G, \"num_kv_splits\": 2, \"plan\": true}" \
  --config "s2={$G, \"num_kv_splits\": 2}" 2>&1 | grep -v Warning
echo "== $(date +%T) done"
