#!/usr/bin/env bash
# Session 12, benchmarks of the final tree (one H200; no table: heuristic configs):
#   ab_decode of this tree against session 11's (.exp/ref-s11: git archive bd72e51) and
#   against the guard-free build of this tree (.exp/ref-noguard12: make_noguard.sh), the
#   host cost, and the decode benchmark of the Performance page's shapes.
#   OUT=$OUT bash bench/results/nvidia-h200/session12/callD.sh    # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/callD.sqlite
CASES=${CASES:-"llama-b64:64,32,8,128,128,8192 llama-b8:8,32,8,128,128,65536 \
ds-b32:32,16,1,576,512,16384 kimi-b8:8,16,1,576,512,327600 \
kimi-b8-fp8:8,16,1,576,512,327600,fp8 dp128-b32:32,128,1,576,512,16384 \
ds-b32-q2:32,16,1,576,512,16384,q2"}
case_args=(); for c in $CASES; do case_args+=(--case "$c"); done
for ref in ${REFS:-.exp/ref-s11 .exp/ref-noguard12}; do
  echo "== $(date +%T) A/B against $(basename $ref)"
  timeout ${AB_SECONDS:-110} python3 tools/ab_decode.py --ref-path "$ref" --rounds 2 --reps 10 \
    "${case_args[@]}" --config heuristic --out "$OUT/ab-$(basename $ref).json" 2>&1 | tail -10
done
echo "== $(date +%T) host"
PYTHONPATH=/tmp/site:$PWD timeout 90 python3 tools/bench_host.py --out "$OUT/host.json" 2>&1 | tail -12
echo "== $(date +%T) decode benchmark"
PYTHONPATH=/tmp/site:$PWD timeout ${BENCH_SECONDS:-170} python3 tools/bench_decode.py --max-cands 2 \
  --time-limit $(( ${BENCH_SECONDS:-170} - 25 )) --shapes ${SHAPES:-kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384,llama3-8b-gqa-long,llama3-8b-gqa-b8-c32768,llama3-8b-gqa-b64-c8192,deepseek-v3-tp1,ragged-b128-m16384} \
  --out "$OUT/decode.json" 2>&1 | tail -45
echo "== $(date +%T) done"
