#!/usr/bin/env bash
# Session 21, call 2 (one H200): re-tune after call 1's Gluon change (the next tile's copies
# under the score MMA from ids loaded a tile ahead; the decode source hash changed): every
# preset's keys, the first 24 candidates of each key's valid space, resumed on session
# 20's database (its KV-write rows carry: kv_write's source is unchanged), cut at 6
# minutes, exported.
#   OUT=$OUT bash bench/results/nvidia-h200/session21/call2.sh      # carry [".whl"]
# The run stopped at its 6 minutes with 128 of 166 keys exported (a fresh machine: 386 s of
# compiling); the same call resumed it on the warm machine's database (call2b-*):
#   TUNE_MINUTES=3 OUT=$OUT bash bench/results/nvidia-h200/session21/call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
export MAX_CANDS=${MAX_CANDS:-24} TUNE_MINUTES=${TUNE_MINUTES:-6} STATE=/tmp/call2-state
export BASE_DB=${BASE_DB:-bench/results/nvidia-h200/session20/h200.sqlite}
bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call2-session.log"; mv "$OUT/tune.txt" "$OUT/call2-tune.txt"
