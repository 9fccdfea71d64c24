#!/usr/bin/env bash
# Session 26, call 5 (one H200, the device minutes left): call 4's tune stopped at its
# budget with the GQA/MHA presets' decode keys untuned; resume on call 4's database
# (carried) for those presets, 8 candidates a key, as long as the time allows, and export.
#   OUT=$OUT bash bench/results/nvidia-h200/session26/call5.sh
#   # carry [".whl", "bench/results/nvidia-h200/session26/h200.sqlite"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
export MAX_CANDS=8 STATE=/tmp/s26b-state BASE_DB=bench/results/nvidia-h200/session26/h200.sqlite
export PRESETS=llama3-8b,ouro-1.4b,huginn,gemma2-9b,llama3.2-1b
TUNE_MINUTES=${TUNE_MINUTES:-2.0} bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call5-session.log"; mv "$OUT/tune.txt" "$OUT/call5-tune.txt"
