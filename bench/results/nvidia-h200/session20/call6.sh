#!/usr/bin/env bash
# Session 20, call 6 (one H200): call 2's re-tune again (the same kernels and hashes) with
# the tuner timing each key's first timed candidate a second time at the key's end and
# keeping the faster (call 2's tune had the first timed split count ~10% slow at Gluon
# keys, as session 18's): every preset's keys, the first 24 candidates of each
# key's valid space (fp8 keys of more than 16 rows now include the Gluon tile), resumed on
# session 18's database (its KV-write rows carry: kv_write's source is unchanged), cut at
# 6 minutes, exported.
#   OUT=$OUT bash bench/results/nvidia-h200/session20/call6.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
export MAX_CANDS=${MAX_CANDS:-24} TUNE_MINUTES=${TUNE_MINUTES:-6} STATE=/tmp/call6-state
export BASE_DB=${BASE_DB:-bench/results/nvidia-h200/session18/h200.sqlite}
bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call6-session.log"; mv "$OUT/tune.txt" "$OUT/call6-tune.txt"
