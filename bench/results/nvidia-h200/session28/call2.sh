#!/usr/bin/env bash
# Session 28, call 2 (one H200): call 1's decode GPU tests passed (54; pytest's summary at
# 252 s, then the 260 s timeout struck the process's exit, so call 1 stopped there). Here:
# fp8 GQA at 1- and 2-warp tiles beside the heuristic's 4-warp one (issue 17: fp8 GQA keeps
# two programs of 4 warps per SM), same run, A/B against the pre-cleanup tree (its GQA
# kernel is the same code); then the re-tune of every preset's decode keys, 8 candidates
# a key, on session 27's database (its kv_write rows are current), export.
#   OUT=$OUT bash bench/results/nvidia-h200/session28/call2.sh
#   # carry [".whl", ".exp/ab-ref"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) fp8 GQA tiles"
T='"block_h": 16, "num_kv_splits": 8, "pdl": false, "merge": false'
timeout 120 python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call2-ab-gqa-fp8.json --rounds 2 \
  --case llama-b4-fp8:4,32,8,128,128,262144,fp8 --config heuristic \
  --config "{$T, \"block_n\": 64, \"num_warps\": 2, \"num_stages\": 3}" \
  --config "{$T, \"block_n\": 128, \"num_warps\": 2, \"num_stages\": 2}" \
  --config "{$T, \"block_n\": 32, \"num_warps\": 1, \"num_stages\": 3}" \
  --config "{$T, \"block_n\": 64, \"num_warps\": 1, \"num_stages\": 2}" 2>&1 | grep -v Warning
left=$(( 575 - SECONDS ))
echo "== $(date +%T) tune ($left s left)"
export MAX_CANDS=8 STATE=/tmp/s28-state BASE_DB=bench/results/nvidia-h200/session27/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=$(python3 -c "print(round(($left - 45) / 60, 1))") bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call2-session.log"; mv "$OUT/tune.txt" "$OUT/call2-tune.txt"
echo "== $(date +%T) done ($SECONDS s)"
