#!/usr/bin/env bash
# Session 12, call A (nvidia-h200-x2): the tuner's throughput alone on the host first (issue
# 20: tools/bench_tune.sh one-gpu-6,scale-12, GPU test first), then at once: GPU 0 the Gluon
# MLA check (base and seesaw variants: correctness, bad pages, timing at 128 heads), GPU 1
# the GPU tests of this tree. Everything is packed into $OUT/callA.tgz.
#   OUT=$OUT bash bench/results/nvidia-h200/session12/callA.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
FINAL=$OUT
RAW=/tmp/callA; mkdir -p $RAW
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
if [ -n "${TUNE_STEPS-one-gpu-6,scale-12}" ]; then  # TUNE_STEPS= skips it (one-GPU host)
  echo "== $(date +%T) bench_tune"
  OUT=$RAW/tune GPU_TEST=1 timeout 280 bash tools/bench_tune.sh "${TUNE_STEPS-one-gpu-6,scale-12}" \
    2>&1 | tail -30
fi
GPU1=${GPU1:-1}  # the GPU tests' device (GPU1=0 on a one-GPU host: then after the check)
export PYTHONPATH=/tmp/site:$PWD
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
gluon() {
  export CUDA_VISIBLE_DEVICES=0
  echo "== $(date +%T) gluon check (GPU 0)"
  OUT=$RAW/gluon timeout 270 python3 tools/gluon_mla_check.py > $RAW/gluon.txt 2>&1
  echo "== $(date +%T) gluon check done (rc $?)"
}
if [ "$GPU1" = 0 ]; then gluon; else gluon & fi
(
  export CUDA_VISIBLE_DEVICES=$GPU1 KDISPATCH_DB=/tmp/gputest.sqlite
  echo "== $(date +%T) GPU tests (GPU 1)"
  timeout 260 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests tests/torch \
    tests/test_memory_safety.py > $RAW/gpu-tests.txt 2>&1
  echo "== $(date +%T) GPU tests done (rc $?)"
) &
wait
tail -25 $RAW/gpu-tests.txt
grep -E "SUMMARY|error|Error" $RAW/gluon.txt | tail -30
tar czf $FINAL/callA.tgz -C $RAW .
echo "== $(date +%T) done"
