#!/usr/bin/env bash
# Session 27, call 3 (one H200, the session's last ~9 device minutes): call 2 found the
# persistent plan's stage 1 0.85x the item plan's at the ragged b128 (1,223.6 vs 1,446.6 us)
# but its plan kernel 14-78 us (a pass per 16 parts over the batch); the kernel now writes
# each part's first and last slot from the request pass (no parts pass). The work plan's
# GPU tests (the tune is skipped if they fail), then the re-tune of every preset's decode
# keys on session 26's database, 8 candidates a key, export; then bench_flashmla.
#   OUT=$OUT bash bench/results/nvidia-h200/session27/call3.sh
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
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_work_plan_gpu.py \
  > $OUT/call3-gpu-tests.txt 2>&1
rc=$?; echo "rc $rc"; tail -3 $OUT/call3-gpu-tests.txt | cut -c1-400
[ $rc -eq 0 ] || exit 1
export MAX_CANDS=8 STATE=/tmp/s27c-state BASE_DB=bench/results/nvidia-h200/session26/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=${TUNE_MINUTES:-4.3} bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call3-session.log"; mv "$OUT/tune.txt" "$OUT/call3-tune.txt"
cp "$OUT/nvidia-h200.json" db/nvidia-h200.json
unset KDISPATCH_DB
echo "== $(date +%T) bench_flashmla ($SECONDS s in)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
python3 tools/bench_flashmla.py --out $OUT/call3-flashmla.json --rounds 2 --time-limit 40 \
  --shapes deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m4096 \
  --config "pl1={$G, \"num_kv_splits\": 1, \"plan\": true}" 2>&1 | grep -v Warning
echo "== $(date +%T) done"
