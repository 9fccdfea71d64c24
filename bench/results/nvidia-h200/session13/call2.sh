#!/usr/bin/env bash
# Session 13, call 2 (one H200): the Gluon tile's unmasked fast path for clean tiles (branch
# guard-bits-13 at its fast-path commit): the Gluon check (correctness over page sizes, bad pages, timing), the
# Gluon and memory-safety GPU tests, and ab_decode against the guard-free build of this
# tree (.exp/ref-noguard13b: make_noguard.sh), the guard-free build of call 1's tree
# (.exp/ref-noguard13), call 1's tree (.exp/ref-bits13) and main (.exp/ref-main13).
#   OUT=$OUT bash bench/results/nvidia-h200/session13/call2.sh      # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/call2.sqlite
echo "== $(date +%T) gluon check"
OUT=$OUT timeout 200 python3 tools/gluon_mla_check.py --pages 16,32,64 --time-pages 16 \
  --shapes all --budget 180 > $OUT/gluon-check.txt 2>&1
echo "rc $?"; grep -E "SUMMARY|FAIL|rror|us" $OUT/gluon-check.txt | tail -40
echo "== $(date +%T) GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
  tests/gpu/test_gluon_gpu.py tests/test_memory_safety.py > $OUT/gpu-tests.txt 2>&1
echo "rc $?"; tail -6 $OUT/gpu-tests.txt
export PYTHONPATH=/tmp/site
CASES="dp128-b32:32,128,1,576,512,16384 ds-b32-q2:32,16,1,576,512,16384,q2 ds-b32:32,16,1,576,512,16384"
case_args=(); for c in $CASES; do case_args+=(--case "$c"); done
for ref in .exp/ref-noguard13b .exp/ref-noguard13 .exp/ref-bits13 .exp/ref-main13; do
  echo "== $(date +%T) A/B against $(basename $ref)"
  timeout 80 python3 tools/ab_decode.py --ref-path "$ref" --rounds 3 --reps 10 \
    "${case_args[@]}" --config heuristic --out "$OUT/ab-$(basename $ref).json" 2>&1 | tail -8
done
echo "== $(date +%T) done"
