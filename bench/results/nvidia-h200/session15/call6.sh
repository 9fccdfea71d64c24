#!/usr/bin/env bash
# Session 15, call 6 (one H200): llama3-8b ahead-6 twice with the writes timed first (empty
# Triton cache and fresh database each; python3 -m kdispatch.cli tune in a child process).
#   OUT=$OUT bash bench/results/nvidia-h200/session15/call6.sh      # carry [".whl"]
set -uo pipefail
for r in 1 2; do
  mkdir -p $OUT/t$r
  echo "== $(date +%T) ahead-6 ($r)"
  OUT=$OUT/t$r timeout 150 bash tools/bench_tune.sh ahead-6 2>&1 | grep -A3 '"one_gpu_6"'
  grep -E "^compil|^start-up|^measured" $OUT/t$r/ahead-6.log
done
echo "== $(date +%T) done"
