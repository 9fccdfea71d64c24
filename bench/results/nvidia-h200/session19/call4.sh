#!/usr/bin/env bash
# Session 19, call 4 (one H200): the native cache on decode_attention_out too (the out=
# form; install by argument positions). Build, the native GPU tests (both forms bit-equal
# to the public function), the torch-face GPU tests with the cache loaded, one host run.
#   OUT=$OUT bash bench/results/nvidia-h200/session19/call4.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
export KDISPATCH_NATIVE_DIR=/tmp/kdispatch-native
echo "== $(date +%T) build-ops"
python3 -m kdispatch.cli build-ops 2>&1 | tee $OUT/call4-build.txt
echo "== $(date +%T) native and torch-face GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
  tests/gpu/test_native_gpu.py tests/gpu/test_torch_gpu.py > $OUT/call4-tests.txt 2>&1
echo "rc $?"
grep -E "passed|failed|^E  |^FAILED" $OUT/call4-tests.txt | cut -c1-300 | head -20
echo "== $(date +%T) host"
timeout 60 python3 tools/bench_host.py --out $OUT/call4-host-native.json \
  > $OUT/call4-host-native.txt 2>&1; echo "rc $?"
grep -E "^host|bare|torch op /|write_kv /|decode .* / bare" $OUT/call4-host-native.txt
echo "== $(date +%T) done"
