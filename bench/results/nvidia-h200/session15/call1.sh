#!/usr/bin/env bash
# Session 15, call 1 (one H200): the fast checks of the cached launch paths and the memo
# hit's guard-first resolve. GPU tests (torch face, memo guard, writer, decode), then the
# host cost of this tree against session 14's main (.exp/ref-s14: git archive 05bfabc
# kdispatch tools), alternated A B A B in one call.
#   OUT=$OUT bash bench/results/nvidia-h200/session15/call1.sh  # carry [".whl", ".exp/ref-s14"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
echo "== $(date +%T) GPU tests"
PYTHONPATH=/tmp/site:$PWD timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
  -m gpu tests/gpu/test_torch_gpu.py tests/gpu/test_memo_guard_gpu.py tests/torch \
  tests/gpu/test_kv_write_gpu.py tests/gpu/test_decode_attention_gpu.py \
  tests/gpu/test_fp8_mtp_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "rc $?"; tail -3 $OUT/gpu-tests.txt
for r in 1 2; do
  echo "== $(date +%T) host, this tree ($r)"
  PYTHONPATH=/tmp/site:$PWD timeout 90 python3 tools/bench_host.py --out "$OUT/host-new-$r.json" 2>&1 | tail -9
  echo "== $(date +%T) host, session 14 main ($r)"
  PYTHONPATH=/tmp/site:$PWD/.exp/ref-s14 timeout 90 python3 .exp/ref-s14/tools/bench_host.py \
    --out "$OUT/host-s14-$r.json" 2>&1 | tail -9
done
echo "== $(date +%T) done"
