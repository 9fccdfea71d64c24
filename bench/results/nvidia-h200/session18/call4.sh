#!/usr/bin/env bash
# Session 18, call 4 (one H200): with call 1's table shipped, the Performance page's bf16
# shapes with their length twins (as session 17's call 3), to check the re-tuned table.
#   OUT=$OUT bash bench/results/nvidia-h200/session18/call4.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
S=kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384,llama3-8b-gqa-long,llama3-8b-gqa-b8-c32768,llama3-8b-gqa-b64-c8192,deepseek-v3-tp1,ragged-b128-m16384
echo "== $(date +%T) decode bf16 + twins"
timeout 240 python3 tools/bench_decode.py --max-cands 2 --time-limit 200 --twins --kv bf16 --q-len 1 \
  --shapes $S --out $OUT/call4-decode-bf16.json 2>&1 | tail -22
echo "== $(date +%T) done"
