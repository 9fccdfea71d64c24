#!/usr/bin/env bash
# Session 22, call 3 (one H200): the Gluon MLA tile with its TMA copies in a copy warp of
# their own (warp-specialized: the two warpgroups wait on the stage's mbarrier and release
# it through a second one; no CTA barriers around copies in their loop). Its GPU tests,
# then a same-run A/B against main (.exp/ab-ref) at the Gluon config (2 splits), then:
#  - a gain (16-token pages at 0.97x or less, no case above 1.02x): the re-tune of every
#    preset on session 21's database (the decode source hash changed), to be resumed by
#    call 4 on the same machine when its minutes run out;
#  - else: the llama3.2-1b preset tuned on session 21's database with main's kernels and
#    head dim 64's finer split ladder (.exp/d64), and the export.
#   OUT=$OUT bash bench/results/nvidia-h200/session22/call3.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) Gluon GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
  tests/gpu/test_gluon_gpu.py > $OUT/call3-gluon-tests.txt 2>&1
rc=$?; echo "rc $rc"; tail -2 $OUT/call3-gluon-tests.txt | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/call3-gluon-tests.txt | cut -c1-300 | head
gain=0
if [ $rc -eq 0 ]; then
  echo "== $(date +%T) A/B"
  G='{"kernel": "gluon", "num_kv_splits": 2, "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2}'
  timeout 200 python3 tools/ab_decode.py --ref-path .exp/ab-ref --cur-path .exp/cur \
    --out $OUT/call3-ab.json --rounds 3 --reps 30 --config "$G" \
    --case h128-p16:32,128,1,576,512,16384 --case h128-p64:32,128,1,576,512,16384,p64 \
    --case h128-p64-fp8:32,128,1,576,512,16384,fp8,p64 --case h16q2-p16:32,16,1,576,512,16384,q2 \
    --case rag128-p64:128,128,1,576,512,32768,rag,p64 > $OUT/call3-ab.txt 2>&1; echo "rc $?"
  tail -6 $OUT/call3-ab.txt | cut -c1-200
  python3 - $OUT/call3-ab.json <<'PY' && gain=1
import json, sys
rows = {r["case"]: r["cur_over_ref"] for r in json.load(open(sys.argv[1]))["rows"]}
sys.exit(0 if rows.get("h128-p16", 9) <= 0.97 and max(rows.values()) <= 1.02 else 1)
PY
fi
export MAX_CANDS=24 STATE=/tmp/s22-state BASE_DB=bench/results/nvidia-h200/session21/h200.sqlite
if [ $gain -eq 1 ]; then
  echo "== $(date +%T) gain: re-tune"
  export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
  TUNE_MINUTES=5.2 bash tools/gpu_session.sh tune
  mv "$OUT/session.log" "$OUT/call3-session.log"; mv "$OUT/tune.txt" "$OUT/call3-tune.txt"
else
  echo "== $(date +%T) no gain: llama3.2-1b on main's kernels with the d64 ladder"
  mkdir -p $STATE && install -m 644 $BASE_DB $STATE/d64.sqlite
  (cd .exp/d64 && KDISPATCH_DB=$STATE/d64.sqlite timeout 200 python3 -m kdispatch.cli tune \
     --device cuda:0 --preset llama3.2-1b --max-candidates 24 --budget-minutes 3 2>&1 \
     | tail -12 > $OUT/call3-d64-tune.txt
   KDISPATCH_DB=$STATE/d64.sqlite python3 -m kdispatch.cli export --device nvidia-h200 \
     -o $OUT/nvidia-h200.json 2>&1 | tail -3)
  cat $OUT/call3-d64-tune.txt | cut -c1-200
  python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); s.execute('PRAGMA wal_checkpoint(TRUNCATE)'); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" $STATE/d64.sqlite $OUT/h200.sqlite
fi
echo "== $(date +%T) done"
