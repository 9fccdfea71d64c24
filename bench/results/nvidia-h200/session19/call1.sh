#!/usr/bin/env bash
# Session 19, call 1 (one H200): the native launch cache of torch.ops.kdispatch.write_kv.
# Build it (kdispatch build-ops), run its GPU tests, then tools/bench_host.py with it off
# (KDISPATCH_FAST_OPS=0: the Python kernel) and on, interleaved: off, on, off, on.
#   OUT=$OUT bash bench/results/nvidia-h200/session19/call1.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
export KDISPATCH_NATIVE_DIR=/tmp/kdispatch-native
echo "== $(date +%T) build-ops"
start=$(date +%s)
python3 -m kdispatch.cli build-ops 2>&1 | tee $OUT/call1-build.txt
echo "build seconds: $(( $(date +%s) - start ))" | tee -a $OUT/call1-build.txt
python3 -m kdispatch.cli doctor 2>&1 | grep -E "device|versions|native" | tee -a $OUT/call1-build.txt
echo "== $(date +%T) native GPU tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_native_gpu.py \
  > $OUT/call1-native-tests.txt 2>&1; echo "rc $?"
tail -15 $OUT/call1-native-tests.txt
for r in 1 2; do
  echo "== $(date +%T) host round $r: Python kernel, then native"
  KDISPATCH_FAST_OPS=0 timeout 120 python3 tools/bench_host.py \
    --out $OUT/call1-host-python-$r.json > $OUT/call1-host-python-$r.txt 2>&1; echo "rc $?"
  timeout 120 python3 tools/bench_host.py \
    --out $OUT/call1-host-native-$r.json > $OUT/call1-host-native-$r.txt 2>&1; echo "rc $?"
  grep -E "^host|write_kv|bare|decode_attention GQA 32|torch op" $OUT/call1-host-python-$r.txt
  grep -E "^host|write_kv|torch op" $OUT/call1-host-native-$r.txt
done
echo "== $(date +%T) done"
