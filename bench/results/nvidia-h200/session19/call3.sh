#!/usr/bin/env bash
# Session 19, call 3 (one H200): the native launch cache's GPU tests after call 2's test
# fixes (a sync check that covered torch.equal; decode scripts whose body was dedented
# into a function). Writes and decode through the C++ kernels against the public
# functions, graph replays, stats.
#   OUT=$OUT bash bench/results/nvidia-h200/session19/call3.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
echo "== $(date +%T) native GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_native_gpu.py \
  > $OUT/call3-native-tests.txt 2>&1; echo "rc $?"
grep -E "passed|failed|^E  |bad|served|counted" $OUT/call3-native-tests.txt | cut -c1-300 | head -30
echo "== $(date +%T) done"
