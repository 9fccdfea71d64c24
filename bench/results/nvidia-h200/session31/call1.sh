#!/usr/bin/env bash
# Session 31, call 1 (one H200), on branch narrow-fp8 (the narrow fp8 MLA tile, fp16 scores
# by default): (1) session 30's precision probe (narrow_precision.py: per graph-replay scale,
# the narrow tile's error with e4m3 and with fp16 scores beside the 64-row tile's); (2)
# narrow_check.py: errors at lengths around page and tile boundaries, then graph-replay times
# of both score forms against the table's configs and bf16, same run; (3) the Gluon GPU
# tests (interrupted, with their summary, at 330 s).
#   OUT=$OUT bash bench/results/nvidia-h200/session31/call1.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
F="Warning\|config, outcome\|tuned with other"
echo "== $(date +%T) precision"
timeout 90 python3 bench/results/nvidia-h200/session30/narrow_precision.py $OUT/call1-precision.json 2>&1 | grep -v "$F"
echo "== $(date +%T) narrow_check ($SECONDS s in)"
timeout 140 python3 bench/results/nvidia-h200/session31/narrow_check.py --out $OUT/call1-narrow.json 2>&1 \
  | grep -v "$F" | grep -v "^check.*stable True" | tail -80
echo "== $(date +%T) Gluon GPU tests ($SECONDS s in)"
timeout -s INT 330 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --tb=short --durations=12 \
  tests/gpu/test_gluon_gpu.py > $OUT/call1-gpu-tests.txt 2>&1
echo "rc $?"; tail -45 $OUT/call1-gpu-tests.txt | cut -c1-300
echo "== $(date +%T) done ($SECONDS s)"
