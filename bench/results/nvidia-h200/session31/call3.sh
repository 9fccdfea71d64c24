#!/usr/bin/env bash
# Session 31, call 3 (one H200), on branch narrow-fp8 as it merges (decode hash
# b061911615ae14a2, db/ from call 2's tune): (1) every GPU test (tools/gpu_session.sh's
# set: -m gpu tests tests/torch tests/test_memory_safety.py), interrupted with their
# summary at 440 s; (2) seesaw_retime.py: the one key call 2's tune had past 1.08x at its
# heuristic (128 heads b128 x 16,384, bf16), both split counts again in one run.
#   OUT=$OUT bash bench/results/nvidia-h200/session31/call3.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
python3 -c "from kdispatch.kernels.decode_attention.op import OP; print('decode hash', OP.source_hash())"
echo "== $(date +%T) seesaw retime"
timeout 60 python3 bench/results/nvidia-h200/session31/seesaw_retime.py $OUT/call3-seesaw.json 2>&1 | tail -3
echo "== $(date +%T) GPU tests ($SECONDS s in)"
timeout -s INT 440 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu -rfE --tb=short \
  --durations=8 tests tests/torch tests/test_memory_safety.py > $OUT/call3-gpu-tests.txt 2>&1
echo "rc $?"; tail -30 $OUT/call3-gpu-tests.txt | cut -c1-300
echo "== $(date +%T) done ($SECONDS s)"
