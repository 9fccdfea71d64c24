#!/usr/bin/env bash
# Session 15, call 4 (one H200): every GPU-marked test on the final tree (fast checks, GQA
# heuristic, kv_write inputs on the device, the executable's quick exit), then the wait
# policy A/B of the compile-ahead tune (gap_timeline.py: this tree's policy and --wait old,
# alternated, two runs each; empty Triton cache and fresh database each).
#   OUT=$OUT bash bench/results/nvidia-h200/session15/call4.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) GPU tests"
timeout 330 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests \
  > $OUT/gpu-tests.txt 2>&1
echo "rc $?"; tail -4 $OUT/gpu-tests.txt
HERE=bench/results/nvidia-h200/session15
i=0
for wait in new old new old; do
  i=$((i + 1)); log=$OUT/timeline-$i-$wait.txt
  export TRITON_CACHE_DIR=/tmp/tl-cache-$i
  rm -rf "$TRITON_CACHE_DIR" /tmp/tl-$i.sqlite*
  echo "== $(date +%T) timeline $i, wait policy $wait"
  start=$(date +%s.%N)
  timeout 90 python3 $HERE/gap_timeline.py --wait $wait --device cuda:0 --preset llama3-8b \
    --max-candidates 6 --db /tmp/tl-$i.sqlite > "$log" 2>&1
  rc=$?; end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" -v rc=$rc 'BEGIN { printf "rc %d; wall %.1f s\n", rc, e - s }' | tee -a "$log"
  grep -E "^compile|^start-up|ready #1 |tune returned" "$log"
done
echo "== $(date +%T) done"
