#!/usr/bin/env bash
# Session 15, calls 7-8 (one H200): the fp8 writer probe (fp8_writer_probe.py: K/V split
# programs and the clamp-free cast, bit-checked against kdispatch's fp8 writer, timed as 96
# one-token writes in one graph beside kdispatch's bf16 and fp8 writers; call 8 adds the
# timing-only variants: cast only, scale multiplied in, no exact-division fallback).
#   OUT=$OUT bash bench/results/nvidia-h200/session15/call7.sh      # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
timeout 240 python3 bench/results/nvidia-h200/session15/fp8_writer_probe.py --rounds 3 \
  --out $OUT/fp8-writer-probe.json 2>&1 | tail -16
