#!/usr/bin/env bash
# Session 29, call 2 (one H200): call 1 found the plan's tiles slower than the split
# grid's (full context, the same work in 64 parts: 2.33 vs 1.97 us a tile). The timeline
# again with %clock64 around each segment (the SM clock of each config), the configs
# alternated twice, the forced 64-part plan also in the split grid's program order (q64),
# and the SM clock and power sampled by nvidia-smi alongside.
#   OUT=$OUT bash bench/results/nvidia-h200/session29/call2.sh
#   # carry [".whl", ".exp/diag"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
  --format=csv -lms 200 > $OUT/call2-smi.csv 2>&1 &
SMI=$!
cd .exp/diag
echo "== $(date +%T) timeline"
PYTHONPATH=/tmp/site:$PWD timeout 500 python3 ../../bench/results/nvidia-h200/session29/diag_timeline.py \
  --out $OUT/call2-timeline.json 2>&1 | grep -v Warning | tail -30
kill $SMI
echo "== smi: sm clock MHz histogram"
awk -F', ' 'NR>1 {print $2}' $OUT/call2-smi.csv | sort | uniq -c | sort -rn | head -8
echo "== $(date +%T) done ($SECONDS s)"
