#!/usr/bin/env bash
# Session 14, call 6 (one H200): the host cost twice more on call 5's tree (the spread of
# the ratios from run to run).
#   OUT=$OUT bash bench/results/nvidia-h200/session14/call6.sh      # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
for i in 1 2; do
  echo "== $(date +%T) host $i"
  timeout 75 python3 tools/bench_host.py --out "$OUT/call6-host-$i.json" 2>&1 | tail -10
done
echo "== $(date +%T) done"
