#!/usr/bin/env bash
# Issue #20's tuning-throughput measurements, one device call per line below (each stays
# under the device's 10 minutes); results land under $OUT (bench_tune-<steps>.json/.md and
# one .log per tuner run).
#
#   GPU_TEST=1 bash tools/bench_tune.sh one-gpu-6,scale-12   # nvidia-h200-x2, ~5-6 min
#   bash tools/bench_tune.sh full-both                        # any H200 host, <= 9 min
#   bash tools/bench_tune.sh full-llama   /   full-kimi       # one preset per call instead
#
# GPU_TEST=1 first runs tests/gpu/test_tune_gpu.py (compile-ahead and compile-at-launch runs
# choose the same configs; the timing process compiles nothing itself); a failure stops the
# call before any measurement.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STEPS=${1:-one-gpu-6,scale-12}
if ls .whl/*.whl >/dev/null 2>&1; then   # the GPU image lacks pydantic and sqlalchemy
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
unset TRITON_INTERPRET KDISPATCH_DB
# The device image sets PYTHONDONTWRITEBYTECODE=1 and its torch has no __pycache__: every
# process compiled torch's sources again (import torch 3.3-3.9 s instead of ~2.4 s, in the
# tuner, each worker and each of ~31 compile-pool processes at once), which no installed
# torch does. Bytecode goes to a cache of its own, filled once here, outside the timings.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/kdispatch-pycache}
python3 -c "import kdispatch.cli.tune, kdispatch.tuning.parallel, kdispatch.tuning.sweep, \
kdispatch.tuning.precompile as p, rich.progress; p.warm_up()" || exit 1
echo "== $(date +%T) $(nproc) cores; $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
if [ "${GPU_TEST:-0}" = "1" ]; then
  echo "== $(date +%T) gpu test: compile ahead vs at launch"
  timeout 240 python3 -m pytest -q -p no:warnings tests/gpu/test_tune_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/gpu-test.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "== GPU test failed: no measurement"; exit 3; }
fi
python3 tools/bench_tune.py --steps "$STEPS" --out "$OUT" ${BENCH_ARGS:-}  # BENCH_ARGS=--cpu-dry-run: a CPU check
