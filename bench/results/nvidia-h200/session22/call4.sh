#!/usr/bin/env bash
# Session 22, call 4 (one H200, right after call 3 on the same machine when it stays warm;
# else from call 3's database, carried as .exp/call3.sqlite): the re-tune resumed and
# exported, every GPU test on the new kernels and table, then the MLA benchmarks.
#   OUT=$OUT bash bench/results/nvidia-h200/session22/call4.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1 TEST_SECONDS=260
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache STATE=/tmp/s22-state BASE_DB=.exp/call3.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
export MAX_CANDS=24 TUNE_MINUTES=${TUNE_MINUTES:-3}
bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call4-tune-session.log"; mv "$OUT/tune.txt" "$OUT/call4-tune.txt"
cp "$OUT/nvidia-h200.json" db/nvidia-h200.json
bash tools/gpu_session.sh tests
mv "$OUT/session.log" "$OUT/call4-session.log"; mv "$OUT/gpu-tests.txt" "$OUT/call4-gpu-tests.txt"
grep -E "^(FAILED|ERROR)" "$OUT/call4-gpu-tests.txt" | cut -c1-300 | head -20
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) bench_decode"
timeout 150 python3 tools/bench_decode.py --kv bf16,fp8 --q-len 1,2 --max-cands 2 \
  --time-limit 120 --out $OUT/call4-decode.json \
  --shapes deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-tp8-mla-b32-c16384,dp-ragged-b128-m16384 \
  > $OUT/call4-decode.txt 2>&1; echo "rc $?"
tail -40 $OUT/call4-decode.txt | grep -v "^  (" | cut -c1-130
echo "== $(date +%T) done"
