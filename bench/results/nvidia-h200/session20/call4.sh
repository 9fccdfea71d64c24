#!/usr/bin/env bash
# Session 20, call 4 (one H200): tools/bench_decode.py at the heuristic's configs (and split
# 1, the early reduce and the merge twin) on the Kimi and DeepSeek TP8 MLA shapes, bf16 and
# fp8 caches, one and two query tokens (12 heads x 2 = 24 rows: the Gluon tile for both
# cache dtypes now).
#   OUT=$OUT bash bench/results/nvidia-h200/session20/call4.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
timeout 330 python3 tools/bench_decode.py --kv bf16,fp8 --q-len 1,2 --max-cands 1 \
  --time-limit 250 --out $OUT/call4-decode.json \
  --shapes kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384 \
  > $OUT/call4-decode.txt 2>&1; echo "rc $?"
tail -14 $OUT/call4-decode.txt | cut -c1-220
