#!/usr/bin/env bash
# Session 14, call 4 (one H200): the memo hit's C++ guard (branch memo-hit) and the tuner's
# overlap fix (IDLE_POLL_S): the torch-face and memo-guard GPU tests; the host cost; the
# tuner's GPU test and issue 20's one-GPU tune time (bench_tune.sh ahead-6, empty Triton
# cache); the key warm-up bias experiment (warmup_bias.py: first timed vs twin at 200, 60
# and 0 ms).
#   OUT=$OUT bash bench/results/nvidia-h200/session14/call4.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
RAW=$OUT  # files land in $OUT as written (a cut call keeps them)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) GPU tests: torch face, memo guard"
timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
  tests/gpu/test_torch_gpu.py tests/gpu/test_memo_guard_gpu.py tests/torch > $RAW/gpu-tests.txt 2>&1
echo "rc $?"; tail -3 $RAW/gpu-tests.txt
echo "== $(date +%T) host"
timeout 75 python3 tools/bench_host.py --out "$RAW/host.json" 2>&1 | tail -14
echo "== $(date +%T) tune time (with the tuner's GPU test)"
(OUT=$RAW GPU_TEST=1 timeout 200 bash tools/bench_tune.sh ahead-6 2>&1 | tail -8)
grep -E "^compil|^start-up|^measured" $RAW/ahead-6.log
echo "== $(date +%T) warm-up bias"
(mkdir -p /tmp/no-tables; export KDISPATCH_TABLE_DIR=/tmp/no-tables
 timeout 90 python3 bench/results/nvidia-h200/session14/warmup_bias.py --out $RAW/bias.json 2>&1 | tail -20)
echo "== $(date +%T) done"
