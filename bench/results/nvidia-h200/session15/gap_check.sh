#!/usr/bin/env bash
# Session 15 (one H200): does branch tune-gap close session 14 call 7's gap (1.2 s between
# the first key's kernels being compiled and its first candidate), and how long does the
# llama3-8b ahead-6 tune (6 candidates per key, empty Triton cache) take with it?
#   1. describe_cost.py: each llama3-8b key's describe cost outside a tune (make_inputs on
#      the host, the GPU work it queued, the launches described): which describes are the
#      ones that can outlast a wait.
#   2. gap_timeline.py (call 7's timeline plus one line per key described, where and how
#      long) with the branch's wait policy twice, each followed by a run with the previous
#      policy (--wait old, for an A/B on this tree; OLD_WAIT=0 leaves them out). Each run
#      has an empty Triton cache and a fresh database; its wall time is the process's, as
#      bench_tune.sh measures a run, and the exit is timed from the tune's return.
#   OUT=$OUT bash bench/results/nvidia-h200/session15/gap_check.sh      # carry [".whl"]
# About 3 minutes of device time (1.5 with OLD_WAIT=0).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
python3 -c "import kdispatch.cli.tune, kdispatch.tuning.parallel, kdispatch.tuning.sweep, \
kdispatch.tuning.precompile as p, rich.progress; p.warm_up()" || exit 1
HERE=bench/results/nvidia-h200/session15
echo "== $(date +%T) describe cost per key"
TRITON_CACHE_DIR=/tmp/gap-describe-cache timeout 150 python3 $HERE/describe_cost.py \
  --device cuda:0 > $OUT/gap-describe-cost.txt 2>&1
echo "rc $?"; sort -k4 -n -r $OUT/gap-describe-cost.txt | grep -E "^ *[0-9]+ " | head -4
tail -1 $OUT/gap-describe-cost.txt
if [ -n "${RUNS_OVERRIDE:-}" ]; then RUNS="new old"; elif [ "${OLD_WAIT:-1}" = "1" ]; then RUNS="new old new old"; else RUNS="new new"; fi
i=0
for wait in $RUNS; do
  i=$((i + 1))
  log=$OUT/gap-timeline-$i-$wait.txt
  export TRITON_CACHE_DIR=/tmp/gap-cache-$i
  rm -rf "$TRITON_CACHE_DIR" /tmp/gap-$i.sqlite*
  echo "== $(date +%T) timeline $i, wait policy $wait"
  start=$(date +%s.%N)
  timeout 120 python3 $HERE/gap_timeline.py --wait $wait --device cuda:0 --preset llama3-8b \
    --max-candidates 6 --db /tmp/gap-$i.sqlite > "$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  epoch=$(awk '/^END_EPOCH/ {print $2}' "$log")
  awk -v s="$start" -v e="$end" -v t="${epoch:-0}" -v rc=$rc 'BEGIN { x = -1; if (t > 0) x = e - t
    printf "rc %d; wall %.1f s; exit after the tune returned %.2f s\n", rc, e - s, x }' \
    | tee -a "$log"
  grep -E "^ +[0-9.]+ s  |^compile|^start-up|^compiling|^describing per place|^longest" "$log"
done
echo "== $(date +%T) done"
