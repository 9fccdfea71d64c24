#!/usr/bin/env bash
# Session 15, call 2 (one H200): the host cost with the write fast check engaged (bench_host's
# write cases now pass distinct K and V), this tree against session 14's main
# (.exp/ref-s14 = git archive 05bfabc kdispatch tools), alternated; the memo hit's parts on
# this host (memo_parts.py, both trees); the GQA heuristic refit (no table: heuristic
# configs) A/B against session 14's main at the keys whose config changed; then issue 20's
# tune time if gap_check.sh is present.
#   OUT=$OUT bash bench/results/nvidia-h200/session15/call2.sh  # carry [".whl", ".exp/ref-s14"]
# As run, the "session 14 main" host runs used this tree: tools/bench_host.py puts its own
# tree first on sys.path, and this script ran ./tools/bench_host.py for both (call 1 ran
# .exp/ref-s14/tools/bench_host.py). Its five host runs are all this tree, stored as
# call2-host-1..5.json in the order run; the memo-parts runs did use both trees.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
HERE=bench/results/nvidia-h200/session15
for r in 1 2 3; do
  echo "== $(date +%T) host, this tree ($r)"
  PYTHONPATH=/tmp/site:$PWD timeout 90 python3 tools/bench_host.py --out "$OUT/host-new-$r.json" 2>&1 | tail -9
  if [ $r -lt 3 ]; then
    echo "== $(date +%T) host, session 14 main ($r)"
    PYTHONPATH=/tmp/site:$PWD/.exp/ref-s14 timeout 90 python3 tools/bench_host.py \
      --out "$OUT/host-s14-$r.json" 2>&1 | tail -9
  fi
done
echo "== $(date +%T) memo parts"
for t in . .exp/ref-s14 . .exp/ref-s14; do
  PYTHONPATH=/tmp/site:$PWD/$t timeout 60 python3 $HERE/memo_parts.py 20 >> "$OUT/memo-parts.jsonl"
done
cat "$OUT/memo-parts.jsonl"
echo "== $(date +%T) GQA heuristic A/B"
(export PYTHONPATH=/tmp/site; mkdir -p /tmp/no-tables
 export KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/call2.sqlite
 timeout 240 python3 tools/ab_decode.py --ref-path .exp/ref-s14 --rounds 2 --reps 10 \
   --case llama-b1-131k:1,32,8,128,128,131072 --case llama-b8-8k:8,32,8,128,128,8192 \
   --case llama-b1-8k:1,32,8,128,128,8192 --case huginn-b1-4k:1,55,55,96,96,4096 \
   --case gemma-b8-32k:8,16,8,256,256,32768 --case l1b-b1-32k:1,32,8,64,64,32768 \
   --case llama-b1-8k-fp8:1,32,8,128,128,8192,fp8 \
   --config heuristic --out "$OUT/ab-gqa-heuristic.json" 2>&1 | tail -12)
if [ -f $HERE/gap_check.sh ]; then
  echo "== $(date +%T) tune gap check"
  timeout 200 bash $HERE/gap_check.sh 2>&1 | tail -20
fi
echo "== $(date +%T) done"
