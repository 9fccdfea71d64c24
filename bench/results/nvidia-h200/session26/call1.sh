#!/usr/bin/env bash
# Session 26, call 1 (one H200): FlashMLA's dense decode built as a same-run peer
# (tools/flashmla_peer.sh, in the background) while the GPU tests not run in session 25 run
# (torch ops, native launch cache, memo guard, tuner, the fp8 writer's refactored test);
# then tools/bench_flashmla.py on the MLA shapes, the peer beside kdispatch.
#   OUT=$OUT bash bench/results/nvidia-h200/session26/call1.sh  # carry [".whl", ".peers/flashmla.tar.xz"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) peer build (background); nvcc $(nvcc --version | grep -o 'release [0-9.]*')"
( time MAX_JOBS=6 bash tools/flashmla_peer.sh build ) > $OUT/peer-build.txt 2>&1 &
build=$!
echo "== $(date +%T) GPU tests not run in session 25"
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_torch_gpu.py \
  tests/gpu/test_native_gpu.py tests/gpu/test_memo_guard_gpu.py tests/gpu/test_tune_gpu.py \
  tests/gpu/test_kv_write_fp8_gpu.py tests/tuning > $OUT/gpu-tests.txt 2>&1
echo "rc $?"; tail -3 $OUT/gpu-tests.txt | cut -c1-200
wait $build; echo "build rc $?"; tail -4 $OUT/peer-build.txt | cut -c1-300
left=$(( 560 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s)"
python3 tools/bench_flashmla.py --out $OUT/flashmla.json --rounds 3 --time-limit $(( left - 70 )) \
  --shapes deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-dp-ragged-b128-m8192,deepseek-v3-dp-ragged-b128-m32768,deepseek-v3-tp8-mla-b32-c16384,deepseek-v3-tp8-mla-b32-c16384-q2,kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b8-c327600,kimi-k3-mla-b1-c65536,deepseek-v3-dp-ragged-b128-m16384-q2,deepseek-v3-tp1-mla-b32-c16384-q2 \
  2>&1 | grep -v Warning
echo "== $(date +%T) done"
