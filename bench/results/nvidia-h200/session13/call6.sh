#!/usr/bin/env bash
# Session 13, call 6 (one H200): the page guard's cost on the final tree, repeated with more
# rounds: ab_decode (no table: heuristic configs) against the guard-free build of the same
# tree (.exp/ref-noguard13c: make_noguard.sh), 4 rounds, GQA, the Triton latent tile (16
# heads bf16 and fp8, 12 heads at 327,600) and the Gluon tile (128 heads; 16 heads x 2).
#   OUT=$OUT bash bench/results/nvidia-h200/session13/call6.sh      # carry [".whl", ".exp/ref-noguard13c"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/call6.sqlite
CASES="llama-b8:8,32,8,128,128,65536 ds-b32:32,16,1,576,512,16384 \
ds-b32-fp8:32,16,1,576,512,16384,fp8 kimi-b8:8,12,1,576,512,327600 \
dp128-b32:32,128,1,576,512,16384 ds-b32-q2:32,16,1,576,512,16384,q2"
case_args=(); for c in $CASES; do case_args+=(--case "$c"); done
echo "== $(date +%T) A/B against ref-noguard13c"
timeout 200 python3 tools/ab_decode.py --ref-path .exp/ref-noguard13c --rounds 4 --reps 10 \
  "${case_args[@]}" --config heuristic --out "$OUT/call6-ab-ref-noguard13c.json" 2>&1 | tail -9
echo "== $(date +%T) done"
