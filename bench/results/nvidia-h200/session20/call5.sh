#!/usr/bin/env bash
# Session 20, call 5 (one H200): the ragged 128-head batches of 128 requests (FlashMLA's
# performance cases: lengths around means of 4k-32k, 64-token pages), bf16 and fp8, the
# heuristic (2 splits since session 19's latent rules) beside the first candidates.
#   OUT=$OUT bash bench/results/nvidia-h200/session20/call5.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 tools/bench_decode.py --kv bf16,fp8 --q-len 1 --max-cands 4 \
  --time-limit 220 --out $OUT/call5-decode.json --shapes dp-ragged \
  > $OUT/call5-decode.txt 2>&1; echo "rc $?"
tail -16 $OUT/call5-decode.txt | cut -c1-220
