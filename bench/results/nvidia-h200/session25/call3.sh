#!/usr/bin/env bash
# Session 25, call 3 (one H200): the seesaw with early release (call 2's .exp/seesaw2sf,
# now this tree; decode_notes v25) lands: its Gluon GPU tests, then the decode re-tune of
# every preset on session 25's database (its kv_write rows are current: only the decode
# keys are tuned; 12 candidates a key, in the time left), exported; then the decode and
# fp8/multi-token GPU tests in the time left.
#   OUT=$OUT bash bench/results/nvidia-h200/session25/call3.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) Gluon GPU tests"
timeout 190 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gluon_gpu.py \
  > $OUT/call3-gluon-tests.txt 2>&1
rc=$?; tail -2 $OUT/call3-gluon-tests.txt | cut -c1-200; echo "rc $rc"
[ $rc -eq 0 ] || exit 3
echo "== $(date +%T) decode re-tune"
export MAX_CANDS=12 STATE=/tmp/s25-state BASE_DB=bench/results/nvidia-h200/session25/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
left=$(( 480 - SECONDS )); mins=$(python3 -c "print(max(0.5, ($left - 30) / 60))")
TUNE_MINUTES=$mins bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call3-session.log"; mv "$OUT/tune.txt" "$OUT/call3-tune.txt"
left=$(( 585 - SECONDS ))
echo "== $(date +%T) decode GPU tests ($left s)"
[ $left -ge 30 ] && timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_decode_attention_gpu.py tests/gpu/test_fp8_mtp_gpu.py \
  > $OUT/call3-decode-tests.txt 2>&1
echo "rc $?"; tail -3 $OUT/call3-decode-tests.txt | cut -c1-200
echo "== $(date +%T) done"
