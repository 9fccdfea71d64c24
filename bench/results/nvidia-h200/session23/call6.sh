#!/usr/bin/env bash
# Session 23, call 6 (one H200, call 5's warm machine): the re-tune resumed on call 5's
# database where its time ran out, the export, then every GPU test on the new table.
#   OUT=$OUT bash bench/results/nvidia-h200/session23/call6.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
export MAX_CANDS=16 STATE=/tmp/s23-state WHEELS_INSTALLED=1
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
[ -d /tmp/site ] || { python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --target /tmp/site .whl/*.whl || exit 1; }
TUNE_MINUTES=${TUNE_MINUTES:-3} bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call6-tune-session.log"; mv "$OUT/tune.txt" "$OUT/call6-tune.txt"
TEST_SECONDS=280 bash tools/gpu_session.sh tests
mv "$OUT/session.log" "$OUT/call6-session.log"; mv "$OUT/gpu-tests.txt" "$OUT/call6-gpu-tests.txt"
echo "== $(date +%T) done"
