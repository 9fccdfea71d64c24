#!/usr/bin/env bash
# Session 18, call 2 (one H200): every GPU-marked test and the interpreter-or-GPU decode
# kernel tests on this tree with call 1's table (the first run of the GPU suite since the
# one-wave cap of session 17).
#   OUT=$OUT bash bench/results/nvidia-h200/session18/call2.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
echo "== $(date +%T) gpu tests"
timeout ${TEST_SECONDS:-300} python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
  tests tests/torch tests/test_memory_safety.py > $OUT/call2-gpu-tests.txt 2>&1; echo "rc $?"
tail -6 $OUT/call2-gpu-tests.txt
echo "== $(date +%T) decode kernel tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
  tests/kernels/test_decode_balance.py tests/kernels/test_decode_attention.py \
  tests/kernels/test_decode_multitoken.py tests/kernels/test_decode_fp8.py \
  > $OUT/call2-kernel-tests.txt 2>&1; echo "rc $?"
tail -4 $OUT/call2-kernel-tests.txt
echo "== $(date +%T) done"
