#!/usr/bin/env bash
# (Runs on branch e4m3-scores: the narrow tile with LO_SEP / HI_W, not on main.)
# Session 31, call 4 (one H200): e4m3_variants.py: the narrow tile's e4m3 score forms
# (q's lo parts in an accumulator of their own) against its fp16 one, errors per replay
# scale and graph-replay times, same run.
#   OUT=$OUT bash bench/results/nvidia-h200/session31/call4.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 bench/results/nvidia-h200/session31/e4m3_variants.py $OUT/call4-e4m3.json 2>&1 \
  | grep -v "Warning\|config, outcome\|tuned with other"
echo "== done ($SECONDS s)"
