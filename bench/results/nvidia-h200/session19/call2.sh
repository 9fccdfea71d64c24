#!/usr/bin/env bash
# Session 19, call 2 (one H200): the native launch cache for both torch ops (write_kv and
# decode_attention). Build it, run its GPU tests, tools/bench_host.py with it off
# (KDISPATCH_FAST_OPS=0) and on, interleaved (off, on, off, on), then every other
# GPU-marked test with it loaded (Inductor, reduce-overhead graphs and opcheck then run the
# ops' C++ kernels).
#   OUT=$OUT bash bench/results/nvidia-h200/session19/call2.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
export KDISPATCH_NATIVE_DIR=/tmp/kdispatch-native
echo "== $(date +%T) build-ops"
python3 -m kdispatch.cli build-ops 2>&1 | tee $OUT/call2-build.txt
echo "== $(date +%T) native GPU tests"
timeout 220 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_native_gpu.py \
  > $OUT/call2-native-tests.txt 2>&1; echo "rc $?"
tail -8 $OUT/call2-native-tests.txt | cut -c1-400
for r in 1 2; do
  echo "== $(date +%T) host round $r: Python kernels, then native"
  KDISPATCH_FAST_OPS=0 timeout 90 python3 tools/bench_host.py \
    --out $OUT/call2-host-python-$r.json > $OUT/call2-host-python-$r.txt 2>&1; echo "rc $?"
  timeout 90 python3 tools/bench_host.py \
    --out $OUT/call2-host-native-$r.json > $OUT/call2-host-native-$r.txt 2>&1; echo "rc $?"
  grep -E "^host|write_kv|bare|decode_attention|torch op" $OUT/call2-host-python-$r.txt
  grep -E "^host|write_kv|bare|decode_attention|torch op" $OUT/call2-host-native-$r.txt
done
echo "== $(date +%T) every other GPU test, the cache loaded"
timeout 280 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
  --deselect tests/gpu/test_native_gpu.py tests tests/torch tests/test_memory_safety.py \
  > $OUT/call2-gpu-tests.txt 2>&1; echo "rc $?"
tail -5 $OUT/call2-gpu-tests.txt | cut -c1-400
grep -E "^(FAILED|ERROR)" $OUT/call2-gpu-tests.txt | cut -c1-300 | head -20
echo "== $(date +%T) done"
