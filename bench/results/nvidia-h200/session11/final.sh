#!/usr/bin/env bash
# Session 11's last call (one H200): the host cost twice (the memo hit is host-sensitive),
# then the GPU tests on the final tree.
set -uo pipefail
OUT=${OUT:-$PWD/final-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 KDISPATCH_DB=sqlite:////tmp/final.sqlite
for r in a b; do
  echo "== $(date +%T) host cost ($r)"
  timeout 120 python3 tools/bench_host.py --out "$OUT/host-$r.json" 2>&1 | tail -9
done
echo "== $(date +%T) GPU tests"
timeout 200 env PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -p no:cacheprovider \
  -p no:warnings -m gpu tests tests/torch tests/test_memory_safety.py \
  --deselect tests/gpu/test_tune_gpu.py > "$OUT/gpu-tests.txt" 2>&1
tail -3 "$OUT/gpu-tests.txt"
