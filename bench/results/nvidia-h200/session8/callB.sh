#!/usr/bin/env bash
# call A: the committed tree only (helpers' uncommitted edits are dropped), GPU tests, a quick decode bench
set -uo pipefail
rm -rf kdispatch tools tests examples db && tar xf .exp/head.tar
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
python3 tools/ceilings.py --out "$OUT/ceilings.json" 2>&1 | tail -2
timeout 280 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests tests/torch tests/test_memory_safety.py > "$OUT/gpu-tests.txt" 2>&1
echo "gpu tests rc $?"; tail -8 "$OUT/gpu-tests.txt"
timeout 130 python3 tools/bench_decode.py --max-cands 4 --time-limit 110 --kv bf16,fp8 --q-len 1,2 \
  --shapes llama3-8b-gqa-b64-c8192,llama3-8b-gqa-long,kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384 \
  --out "$OUT/decode-quick.json" 2>&1 | tail -40
