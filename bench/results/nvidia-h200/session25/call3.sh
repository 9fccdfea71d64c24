#!/usr/bin/env bash
# Session 25, call 3 (one H200): the seesaw with early release (call 2's .exp/seesaw2sf,
# now this tree; decode_notes v25) lands: the decode re-tune of every preset on session
# 25's database (its kv_write rows are current: only the decode keys are tuned; 12
# candidates a key, in the time given), exported; then the Gluon GPU tests and the decode
# and fp8/multi-token GPU tests in the time left (the device time left to the session
# bounds this call to ~8 minutes).
#   OUT=$OUT bash bench/results/nvidia-h200/session25/call3.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) decode re-tune"
export MAX_CANDS=12 STATE=/tmp/s25-state BASE_DB=bench/results/nvidia-h200/session25/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=4.4 bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call3-session.log"; mv "$OUT/tune.txt" "$OUT/call3-tune.txt"
left=$(( 480 - SECONDS ))
echo "== $(date +%T) Gluon, decode and fp8/multi-token GPU tests ($left s)"
[ $left -ge 30 ] && timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_gluon_gpu.py tests/gpu/test_decode_attention_gpu.py tests/gpu/test_fp8_mtp_gpu.py \
  > $OUT/call3-gpu-tests.txt 2>&1
echo "rc $?"; tail -3 $OUT/call3-gpu-tests.txt | cut -c1-200
echo "== $(date +%T) done"
