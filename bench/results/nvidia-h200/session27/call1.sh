#!/usr/bin/env bash
# Session 27, call 1 (one H200; three refused starts left ~23 device minutes, so one call
# does what two would): the work plan as persistent programs over equal parts (plan=True)
# changed the decode source hash. First the work plan's GPU tests (if they fail, the tune
# below runs without plan candidates); then the re-tune of every preset's decode keys on
# session 26's database (its kv_write rows are current), 8 candidates a key (the Gluon keys
# of several requests try the plan at 1 and 2 programs per SM share), export; then
# tools/bench_flashmla.py on the exported table with the plan at 1 and 2.
#   OUT=$OUT bash bench/results/nvidia-h200/session27/call1.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) work plan GPU tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_work_plan_gpu.py \
  > $OUT/call1-gpu-tests.txt 2>&1
rc=$?; echo "rc $rc"; tail -3 $OUT/call1-gpu-tests.txt | cut -c1-400
if [ $rc -ne 0 ]; then
  sed -i 's/^PLAN_SPLITS = (1, 2)/PLAN_SPLITS = ()/' kdispatch/kernels/decode_attention/spec.py
  echo "plan candidates off for the tune"
fi
export MAX_CANDS=8 STATE=/tmp/s27-state BASE_DB=bench/results/nvidia-h200/session26/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=${TUNE_MINUTES:-4.9} bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call1-session.log"; mv "$OUT/tune.txt" "$OUT/call1-tune.txt"
cp "$OUT/nvidia-h200.json" db/nvidia-h200.json
unset KDISPATCH_DB
left=$(( 575 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
python3 tools/bench_flashmla.py --out $OUT/call1-flashmla.json --rounds 2 --time-limit $(( left - 45 )) \
  --shapes deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-dp-ragged-b128-m32768,deepseek-v3-dp-ragged-b128-m8192 \
  --config "pl1={$G, \"num_kv_splits\": 1, \"plan\": true}" \
  --config "pl2={$G, \"num_kv_splits\": 2, \"plan\": true}" 2>&1 | grep -v Warning
echo "== $(date +%T) done"
