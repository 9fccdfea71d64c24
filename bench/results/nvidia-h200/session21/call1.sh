#!/usr/bin/env bash
# Session 21, call 1 (one H200): the Gluon MLA tile's next-tile copies issued under the
# score MMA, from page ids loaded a tile ahead (each copy sits between CTA barriers the
# compiler inserts; before, every warp waited at them for the id load of the tile).
# Its GPU tests (Gluon and fp8/multi-token), then a same-run A/B against session 20's
# kernels (.exp/ab-ref: `git archive 777f0a7 kdispatch`) at fixed Gluon configs.
#   OUT=$OUT bash bench/results/nvidia-h200/session21/call1.sh   # carry [".whl", ".exp"]
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
echo "== $(date +%T) A/B"
G='{"kernel": "gluon", "num_kv_splits": 2, "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2}'
timeout 300 python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call1-ab.json \
  --rounds 3 --reps 30 --config "$G" \
  --case h128-p16:32,128,1,576,512,16384 --case h128-p64:32,128,1,576,512,16384,p64 \
  --case h128-p64-fp8:32,128,1,576,512,16384,fp8,p64 --case h16q2-p16:32,16,1,576,512,16384,q2 \
  > $OUT/call1-ab.txt 2>&1; echo "rc $?"
tail -30 $OUT/call1-ab.txt | cut -c1-220
echo "== $(date +%T) done"
