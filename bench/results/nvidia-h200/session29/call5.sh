#!/usr/bin/env bash
# Session 29, call 5 (one H200): decode re-tuned for hash bbf50e37e139dbfb (every preset's
# decode keys, 8 candidates a key, on session 28's database: its kv_write rows are
# current) and exported; then FlashMLA beside kdispatch on the ragged 128-head batches
# (means 16,384 and 4,096) with the plan as a config beside the table's.
#   OUT=$OUT bash bench/results/nvidia-h200/session29/call5.sh
#   # carry [".whl", ".peers/flashmla/build", ".peers/flashmla/REVISION"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) tune"
export MAX_CANDS=8 STATE=/tmp/s29-state BASE_DB=bench/results/nvidia-h200/session28/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=5.5 bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call5-session.log"; mv "$OUT/tune.txt" "$OUT/call5-tune.txt"
left=$(( 585 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s left)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
unset KDISPATCH_DB
cp "$OUT/nvidia-h200.json" db/nvidia-h200.json
timeout $(( left - 5 )) python3 tools/bench_flashmla.py --out $OUT/call5-flashmla.json --rounds 2 \
  --time-limit $(( left - 40 )) \
  --shapes deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-dp-ragged-b128-m4096 \
  --config "pl1={$G, \"num_kv_splits\": 1, \"plan\": true}" 2>&1 | grep -v Warning | tail -20
echo "== $(date +%T) done ($SECONDS s)"
