#!/usr/bin/env bash
# Session 20, call 1 (one H200): the fp8 (e4m3) latent on the Gluon MLA tile (TMA'd fp8
# bytes converted per tile to one fp16 tile, q as fp16 in place, scales read on the
# device). Its GPU tests (Gluon and fp8/multi-token), then tools/bench_decode.py on the
# shapes it serves (128 heads; 16 heads x 2 tokens; the ragged 128-head batch of 128)
# with bf16 and fp8 caches: the heuristic (now the Gluon tile for fp8 too) beside the
# first candidates, which hold the Triton 64- and 32-row tiles fp8 ran on before.
#   OUT=$OUT bash bench/results/nvidia-h200/session20/call1.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) GPU tests: Gluon tile, fp8 and multi-token"
timeout 260 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
  tests/gpu/test_gluon_gpu.py tests/gpu/test_fp8_mtp_gpu.py > $OUT/call1-gpu-tests.txt 2>&1
echo "rc $?"
tail -4 $OUT/call1-gpu-tests.txt | cut -c1-400
grep -E "^(FAILED|ERROR)|Error|assert" $OUT/call1-gpu-tests.txt | cut -c1-300 | head -30
echo "== $(date +%T) bench_decode"
timeout 300 python3 tools/bench_decode.py --kv bf16,fp8 --q-len 1,2 --max-cands 4 \
  --time-limit 240 --out $OUT/call1-decode.json \
  --shapes deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-tp8-mla-b32-c16384,dp-ragged-b128-m16384 \
  > $OUT/call1-decode.txt 2>&1; echo "rc $?"
tail -60 $OUT/call1-decode.txt | cut -c1-220
echo "== $(date +%T) done"
