#!/usr/bin/env bash
# Session 13, call 5 (one H200): the re-tune resumed on call 4's database (.exp/call4.sqlite)
# to its end and exported; then, with no table (heuristic configs), ab_decode of the final
# tree against its guard-free build (.exp/ref-noguard13c: make_noguard.sh) and against
# main (.exp/ref-main13); the host cost; and, with the new table in db/, the decode
# benchmark of the Performance page's shapes.
#   OUT=$OUT bash bench/results/nvidia-h200/session13/call5.sh      # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
FINAL=$OUT; RAW=/tmp/call5; mkdir -p $RAW
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
(export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
 export MAX_CANDS=60 STATE=/tmp/call5-state BASE_DB=.exp/call4.sqlite TUNE_MINUTES=${TUNE_MINUTES:-4.5}
 bash tools/gpu_session.sh tune)
cp $FINAL/nvidia-h200.json db/nvidia-h200.json
mv $FINAL/session.log $RAW/call5-session.log; mv $FINAL/tune.txt $RAW/call5-tune.txt
(
export PYTHONPATH=/tmp/site
mkdir -p /tmp/no-tables
export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/call5-ab.sqlite
CASES="llama-b64:64,32,8,128,128,8192 kimi-b8-fp8:8,16,1,576,512,327600,fp8 \
dp128-b32:32,128,1,576,512,16384 ds-b32-q2:32,16,1,576,512,16384,q2 ds-b32:32,16,1,576,512,16384"
case_args=(); for c in $CASES; do case_args+=(--case "$c"); done
for ref in .exp/ref-noguard13c .exp/ref-main13; do
  echo "== $(date +%T) A/B against $(basename $ref)"
  timeout 90 python3 tools/ab_decode.py --ref-path "$ref" --rounds 2 --reps 10 \
    "${case_args[@]}" --config heuristic --out "$RAW/ab-$(basename $ref).json" 2>&1 | tail -8
done
)
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) host"
timeout 75 python3 tools/bench_host.py --out "$RAW/host.json" 2>&1 | tail -14
echo "== $(date +%T) decode benchmark"
timeout 160 python3 tools/bench_decode.py --max-cands 2 --time-limit 135 --shapes \
  kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384,llama3-8b-gqa-long,llama3-8b-gqa-b64-c8192,deepseek-v3-tp1,ragged-b128-m16384 \
  --out "$RAW/decode.json" 2>&1 | tail -30
tar czf $FINAL/call5.tgz -C $RAW .
echo "== $(date +%T) done"
