#!/usr/bin/env bash
# Session 14, call 5 (one H200): the host cost with resolve taking config= from its keyword
# arguments (no named parameter), the rest as in call 4.
#   OUT=$OUT bash bench/results/nvidia-h200/session14/call5.sh      # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) host"
timeout 75 python3 tools/bench_host.py --out "$OUT/call5-host.json" 2>&1 | tail -14
echo "== $(date +%T) done"
