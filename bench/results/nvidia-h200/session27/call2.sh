#!/usr/bin/env bash
# Session 27, call 2 (one H200): the persistent work plan changed the decode source hash:
# re-tune every preset's decode keys on session 26's database (its kv_write rows are
# current), 8 candidates a key (the Gluon keys of several requests try the plan at 1 and 2
# programs per SM share among them), export; then the decode GPU tests on the new table.
#   OUT=$OUT bash bench/results/nvidia-h200/session27/call2.sh
#   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
export MAX_CANDS=8 STATE=/tmp/s27-state BASE_DB=bench/results/nvidia-h200/session26/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=${TUNE_MINUTES:-6.3} bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call2-session.log"; mv "$OUT/tune.txt" "$OUT/call2-tune.txt"
cp "$OUT/nvidia-h200.json" db/nvidia-h200.json
unset KDISPATCH_DB
left=$(( 585 - SECONDS ))
echo "== $(date +%T) GPU tests ($left s)"
timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_decode_attention_gpu.py \
  > $OUT/call2-gpu-tests.txt 2>&1
echo "rc $?"; tail -2 $OUT/call2-gpu-tests.txt | cut -c1-300
echo "== $(date +%T) done"
