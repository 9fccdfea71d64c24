#!/usr/bin/env bash
# Session 20, call 3 (one H200): every GPU-marked test on the re-tuned table (call 2's
# export in db/), with the read and copy ceilings first.
#   OUT=$OUT bash bench/results/nvidia-h200/session20/call3.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1 TEST_SECONDS=420
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache STATE=/tmp/call3-state
bash tools/gpu_session.sh tests
mv "$OUT/session.log" "$OUT/call3-session.log"; mv "$OUT/gpu-tests.txt" "$OUT/call3-gpu-tests.txt"
grep -E "^(FAILED|ERROR)" "$OUT/call3-gpu-tests.txt" | cut -c1-300 | head -20
