#!/usr/bin/env bash
# Session 17, call 7 (one H200): the balanced grid kept within one wave where the config's
# grid fits one with slots to spare (spec.grid_splits' cap, from call 6). A same-run A/B
# against the uncapped 2x grid (.exp/cur), heuristic configs, no tables; if head dim 64 at
# b8 x 32k gains at least 4% at full context, the re-tune as in call 2 (24 candidates
# per decode key, every preset, resumed on session 14's database) and its export.
#   OUT=$OUT bash bench/results/nvidia-h200/session17/call7.sh   # carry [".whl", ".exp/cur"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
mkdir -p /tmp/no-tables
echo "== $(date +%T) A/B"
C="--case d64-b8-32k:8,32,8,64,64,32768 --case d64-b8-32k-rag:8,32,8,64,64,32768,rag
   --case d64-b4-262k:4,32,8,64,64,262144 --case d64-b4-262k-rag:4,32,8,64,64,262144,rag
   --case llama-b8-32k-rag:8,32,8,128,128,32768,rag --case kimi-b8-rag:8,12,1,576,512,327600,rag
   --case tp8-b32:32,16,1,576,512,16384 --case tp8-b32-rag:32,16,1,576,512,16384,rag"
(export PYTHONPATH=/tmp/site KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/ab.sqlite
 timeout 150 python3 tools/ab_decode.py --ref-path .exp/cur $C --rounds 2 --reps 15 \
   --out $OUT/call7-ab.json 2>&1 | tail -10)
python3 - $OUT/call7-ab.json <<'PY' || { echo "== the cap did not gain: no tune"; exit 3; }
import json, sys
r = {x["case"]: x["cur_over_ref"] for x in json.load(open(sys.argv[1]))["rows"]}
print("d64-b8-32k cur/ref", r["d64-b8-32k"])
sys.exit(0 if r["d64-b8-32k"] < 0.96 else 1)
PY
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
export MAX_CANDS=24 TUNE_MINUTES=${TUNE_MINUTES:-5.5} STATE=/tmp/call7-state
export BASE_DB=bench/results/nvidia-h200/session14/h200.sqlite
bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call7-session.log"; mv "$OUT/tune.txt" "$OUT/call7-tune.txt"
