#!/usr/bin/env bash
# Session 29, call 1 (one H200): where the work plan's time goes. The experiment tree
# .exp/diag (HEAD with the seesaw's warpgroup 0 writing %globaltimer stamps: a program's
# start, each segment's q wait and partials store) timed and traced program by program on
# the full-context 128-head batch (split grid vs plan at 66, 64 and 132 parts) and the
# ragged b128 batches (diag_timeline.py beside this).
#   OUT=$OUT bash bench/results/nvidia-h200/session29/call1.sh
#   # carry [".whl", ".exp/diag"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
cd .exp/diag
echo "== $(date +%T) timeline"
PYTHONPATH=/tmp/site:$PWD timeout 500 python3 ../../bench/results/nvidia-h200/session29/diag_timeline.py \
  --out $OUT/call1-timeline.json 2>&1 | grep -v Warning | tail -30
echo "== $(date +%T) done ($SECONDS s)"
