#!/usr/bin/env bash
# Session 14, call 1 (one H200): the narrow latent tile's clean-split loads (branch
# latent-clean-2: a split whose page ids were all found in the cache loads by the token
# range alone), ab_decode with no table (heuristic configs) against the guard-free build of
# the same tree (.exp/ref-noguard14: session12/make_noguard.sh) over 4 rounds and against
# main (.exp/ref-main14) over 2; then issue 20's one-GPU tune time (bench_tune.sh
# one-gpu-6: the 200 ms key warm-up's first GPU run).
#   OUT=$OUT bash bench/results/nvidia-h200/session14/call1.sh
#   # carry [".whl", ".exp/ref-noguard14", ".exp/ref-main14"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
(
export PYTHONPATH=/tmp/site
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/call1.sqlite
for spec in "ref-noguard14 4 kimi-b8:8,12,1,576,512,327600 kimi-b8-16:8,16,1,576,512,327600 ds-b32:32,16,1,576,512,16384 ds-b32-fp8:32,16,1,576,512,16384,fp8 ds-b32-q2:32,16,1,576,512,16384,q2" \
            "ref-main14 2 kimi-b8:8,12,1,576,512,327600 ds-b32:32,16,1,576,512,16384 ds-b32-fp8:32,16,1,576,512,16384,fp8"; do
  set -- $spec; ref=$1; rounds=$2; shift 2
  case_args=(); for c in "$@"; do case_args+=(--case "$c"); done
  echo "== $(date +%T) A/B against $ref"
  timeout 200 python3 tools/ab_decode.py --ref-path ".exp/$ref" --rounds "$rounds" --reps 10 \
    "${case_args[@]}" --config heuristic --out "$OUT/call1-ab-$ref.json" 2>&1 | tail -7
done
)
echo "== $(date +%T) tune time"
timeout 200 bash tools/bench_tune.sh one-gpu-6 2>&1 | tail -12
echo "== $(date +%T) done"
