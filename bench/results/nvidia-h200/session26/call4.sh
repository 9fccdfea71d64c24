#!/usr/bin/env bash
# Session 26, call 4 (one H200; the session's last device minutes, so one call): the work
# plan (plan=True, items rounded) and the dead page argument's removal changed the decode
# source hash: re-tune every preset's decode keys on session 25's database (its kv_write
# rows are current), 8 candidates a key (the Gluon keys of several requests try the plan
# at 2 and 4 items per SM share among them), export; then, on the exported table, the work
# plan and Gluon GPU tests and tools/bench_flashmla.py beside FlashMLA (call 2's build).
#   OUT=$OUT bash bench/results/nvidia-h200/session26/call4.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
export MAX_CANDS=8 STATE=/tmp/s26-state BASE_DB=bench/results/nvidia-h200/session25/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=4.6 bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call4-session.log"; mv "$OUT/tune.txt" "$OUT/call4-tune.txt"
cp "$OUT/nvidia-h200.json" db/nvidia-h200.json
unset KDISPATCH_DB
echo "== $(date +%T) GPU tests ($SECONDS s in)"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_work_plan_gpu.py \
  tests/gpu/test_gluon_gpu.py > $OUT/call4-gpu-tests.txt 2>&1
echo "rc $?"; tail -2 $OUT/call4-gpu-tests.txt | cut -c1-300
left=$(( 575 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
python3 tools/bench_flashmla.py --out $OUT/call4-flashmla.json --rounds 2 --time-limit $(( left - 40 )) \
  --shapes deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-dp-ragged-b128-m32768,deepseek-v3-tp8-mla-b32-c16384,deepseek-v3-tp8-mla-b32-c16384-q2,kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b8-c327600,kimi-k3-mla-b1-c65536,deepseek-v3-dp-ragged-b128-m8192,deepseek-v3-dp-ragged-b128-m16384-q2,deepseek-v3-tp1-mla-b32-c16384-q2 \
  --config "p2={$G, \"num_kv_splits\": 2, \"plan\": true}" \
  --config "p4={$G, \"num_kv_splits\": 4, \"plan\": true}" 2>&1 | grep -v Warning
echo "== $(date +%T) done"
