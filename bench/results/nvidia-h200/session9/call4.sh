#!/bin/bash
# session 9 call 4: host cost (interleaved bench_host) and tuning throughput after the warm-worker change
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
unset TRITON_INTERPRET KDISPATCH_DB
echo "== $(date +%T) host"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/site:$PWD timeout 90 python3 tools/bench_host.py --out $OUT/host.json 2>&1 | tail -24
echo "== $(date +%T) tune throughput"
timeout 170 bash tools/bench_tune.sh ahead-6,scale-12 2>&1 | grep -v "│" | tail -30
echo "== $(date +%T) done"
