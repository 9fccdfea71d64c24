#!/usr/bin/env bash
# Session 22, call 2 (one H200): fp8 GQA's scores on e4m3 MMAs with V converted in two
# column halves (.exp/cur: this tree's kdispatch/; .exp/ab-ref: main before it), same-run
# A/B at the heuristic configs with a bf16 control; when the long-context fp8 case gains
# at least 5%, the re-tune of every preset on session 21's database (the decode source hash
# changed) and its export.
#   OUT=$OUT bash bench/results/nvidia-h200/session22/call2.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) A/B"
timeout 170 python3 tools/ab_decode.py --ref-path .exp/ab-ref --cur-path .exp/cur \
  --out $OUT/call2-ab.json --rounds 3 --reps 30 --config heuristic \
  --case d128-b4:4,32,8,128,128,262144,fp8 --case d128-b64:64,32,8,128,128,8192,fp8 \
  --case d64-b4:4,32,8,64,64,262144,fp8 --case d256-b4:4,32,8,256,256,65536,fp8 \
  --case bf16-d128-b4:4,32,8,128,128,262144 > $OUT/call2-ab.txt 2>&1; echo "rc $?"
tail -7 $OUT/call2-ab.txt | cut -c1-200
python3 - $OUT/call2-ab.json <<'PY' || { echo "== no gain: no tune"; exit 0; }
import json, sys
rows = {r["case"]: r["cur_over_ref"] for r in json.load(open(sys.argv[1]))["rows"]}
sys.exit(0 if rows.get("d128-b4", 9) < 0.95 else 1)
PY
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
export MAX_CANDS=24 TUNE_MINUTES=${TUNE_MINUTES:-6} STATE=/tmp/call2-state
export BASE_DB=bench/results/nvidia-h200/session21/h200.sqlite
bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call2-session.log"; mv "$OUT/tune.txt" "$OUT/call2-tune.txt"
echo "== $(date +%T) done"
