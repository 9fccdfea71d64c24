#!/usr/bin/env bash
# Session 15, call 3 (one H200): issue 20's one-GPU tune time on this tree (the wait policy
# of branch tune-gap, kv_write inputs drawn on the device, the executable's quick exit).
#   1. gap_check's describe cost per key and two timelines (this tree's wait policy, then
#      the previous one: gap_timeline.py --wait old);
#   2. the tuner's GPU test, then bench_tune.sh ahead-6 twice (llama3-8b, 6 candidates per
#      key, empty Triton cache and fresh database each; python3 -m kdispatch.cli tune in a
#      child process, as a user runs it).
#   OUT=$OUT bash bench/results/nvidia-h200/session15/call3.sh      # carry [".whl"]
set -uo pipefail
HERE=bench/results/nvidia-h200/session15
OLD_WAIT=1 RUNS_OVERRIDE=1 timeout 200 bash $HERE/gap_check.sh 2>&1 | tail -40
for r in 1 2; do
  echo "== $(date +%T) bench_tune ahead-6 ($r)"
  mkdir -p $OUT/tune-$r
  OUT=$OUT/tune-$r GPU_TEST=$([ $r = 1 ] && echo 1 || echo 0) timeout 300 \
    bash tools/bench_tune.sh ahead-6 2>&1 | tail -8
  grep -E "^compil|^start-up|^measured" $OUT/tune-$r/ahead-6.log
done
echo "== $(date +%T) done"
