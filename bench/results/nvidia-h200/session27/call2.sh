#!/usr/bin/env bash
# Session 27, call 2 (one H200): call 1's persistent work plan measured no faster than
# session 26's item plan, so main keeps session 26's kernels (their shipped table current)
# and the persistent form lives on branch persistent-plan (.exp/persistent = its tree).
# Where the time goes, launch by launch (tools/plan_launches.py), in both trees; then the
# GPU tests session 26 did not run on its final kernels (main's: the Gluon tile's, the decode
# tests).
#   OUT=$OUT bash bench/results/nvidia-h200/session27/call2.sh
#   # carry [".whl", ".exp/persistent"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
G='"kernel": "gluon"'
echo "== $(date +%T) launches, session 26's kernels (item plan)"
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 tools/plan_launches.py --tag items \
  --out $OUT/call2-launches-items.json --config 's1={"num_kv_splits": 1}' \
  --config 's2={"num_kv_splits": 2}' --config 'p2={"num_kv_splits": 2, "plan": true}' \
  --config 'p4={"num_kv_splits": 4, "plan": true}' 2>&1 | grep -v Warning
echo "== $(date +%T) launches, the persistent plan ($SECONDS s in)"
PYTHONPATH=/tmp/site:$PWD/.exp/persistent timeout 150 python3 .exp/persistent/tools/plan_launches.py \
  --tag persistent --out $OUT/call2-launches-persistent.json --config 's2={"num_kv_splits": 2}' \
  --config 'pl1={"num_kv_splits": 1, "plan": true}' \
  --config 'pl2={"num_kv_splits": 2, "plan": true}' 2>&1 | grep -v Warning
export PYTHONPATH=/tmp/site:$PWD
left=$(( 580 - SECONDS ))
echo "== $(date +%T) GPU tests ($left s)"
timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gluon_gpu.py \
  tests/gpu/test_decode_attention_gpu.py > $OUT/call2-gpu-tests.txt 2>&1
echo "rc $?"; tail -3 $OUT/call2-gpu-tests.txt | cut -c1-400
echo "== $(date +%T) done"
