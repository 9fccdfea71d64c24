#!/usr/bin/env bash
# Session 21, call 3 (one H200): every GPU-marked test on the re-tuned table (call 2's
# export in db/), with the read and copy ceilings first; then tools/bench_decode.py on the
# shapes the Gluon tile serves (128 heads at 16-token pages, DeepSeek TP8's 16 heads x 2
# tokens, the ragged 128-head batch of 128 at 64-token pages), bf16 and fp8 caches, the
# table's config beside the first candidates.
#   OUT=$OUT bash bench/results/nvidia-h200/session21/call3.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1 TEST_SECONDS=300
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache STATE=/tmp/call3-state
bash tools/gpu_session.sh tests
mv "$OUT/session.log" "$OUT/call3-session.log"; mv "$OUT/gpu-tests.txt" "$OUT/call3-gpu-tests.txt"
grep -E "^(FAILED|ERROR)" "$OUT/call3-gpu-tests.txt" | cut -c1-300 | head -20
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) bench_decode"
timeout 270 python3 tools/bench_decode.py --kv bf16,fp8 --q-len 1,2 --max-cands 3 \
  --time-limit 230 --out $OUT/call3-decode.json \
  --shapes deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-tp8-mla-b32-c16384,dp-ragged-b128-m16384 \
  > $OUT/call3-decode.txt 2>&1; echo "rc $?"
tail -40 $OUT/call3-decode.txt | cut -c1-220
echo "== $(date +%T) done"
