#!/usr/bin/env bash
# Session 26, call 4 (one H200): the work plan (plan=True) and the dead page argument's
# removal changed the decode source hash: re-tune every preset's decode keys on session
# 25's database (its kv_write rows are current), 10 candidates a key (the Gluon keys of
# several requests now also try the plan at 2 and 4 items per SM share), and export.
#   OUT=$OUT bash bench/results/nvidia-h200/session26/call4.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
export MAX_CANDS=10 STATE=/tmp/s26-state BASE_DB=bench/results/nvidia-h200/session25/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=5.6 bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call4-session.log"; mv "$OUT/tune.txt" "$OUT/call4-tune.txt"
echo "== $(date +%T) done"
