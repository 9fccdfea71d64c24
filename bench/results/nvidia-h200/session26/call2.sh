#!/usr/bin/env bash
# Session 26, call 2 (one H200): the peer build again (call 1's host compile lacked CUDA 13's
# cccl include folder), its module brought back (so later calls carry it, no rebuild), then
# tools/bench_flashmla.py on the MLA shapes, the peer beside kdispatch.
#   OUT=$OUT bash bench/results/nvidia-h200/session26/call2.sh  # carry [".whl", ".peers/flashmla.tar.xz"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) peer build"
( time MAX_JOBS=8 bash tools/flashmla_peer.sh build ) > $OUT/peer-build.txt 2>&1
echo "build rc $?"; grep -m5 "error" $OUT/peer-build.txt | cut -c1-300; tail -4 $OUT/peer-build.txt
cp .peers/flashmla/build/flash_mla_dense*.so $OUT/ 2>/dev/null
left=$(( 575 - SECONDS ))
echo "== $(date +%T) bench_flashmla ($left s)"
python3 tools/bench_flashmla.py --out $OUT/flashmla.json --rounds 3 --time-limit $(( left - 80 )) \
  --shapes deepseek-v3-tp1-mla-b32-c16384,deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-dp-ragged-b128-m4096,deepseek-v3-dp-ragged-b128-m8192,deepseek-v3-dp-ragged-b128-m32768,deepseek-v3-tp8-mla-b32-c16384,deepseek-v3-tp8-mla-b32-c16384-q2,kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b8-c327600,kimi-k3-mla-b1-c65536,deepseek-v3-dp-ragged-b128-m16384-q2,deepseek-v3-tp1-mla-b32-c16384-q2 \
  2>&1 | grep -v Warning
echo "== $(date +%T) done"
