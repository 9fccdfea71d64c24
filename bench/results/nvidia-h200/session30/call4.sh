#!/usr/bin/env bash
# (Runs on branch narrow-fp8's tree: narrow-fp8.diff here. Written in session 30, not run.)
# Session 30, call 4 (one H200): call 3's two failed narrow-tile graph-replay tests
# diagnosed (narrow_precision.py): per replay, the narrow tile's error with its scores on
# e4m3 MMAs and on fp16 ones (F16_QK), beside the 64-row tile's.
#   OUT=$OUT bash bench/results/nvidia-h200/session30/call4.sh   # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
timeout 110 python3 bench/results/nvidia-h200/session30/narrow_precision.py $OUT/call4-precision.json 2>&1 \
  | grep -v "Warning\|config, outcome\|tuned with other"
echo "== done ($SECONDS s)"
