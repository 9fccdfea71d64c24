#!/usr/bin/env bash
# Session 15, call 5 (one H200): issue 20 on the final tree: llama3-8b ahead-6 once more,
# then the full valid space of kimi-k3-tp8 and llama3-8b in one run (bench_tune.sh
# full-both: each key's full-search best against the best of its capped candidate list,
# measured in the same run). Empty Triton cache and fresh database each.
#   OUT=$OUT bash bench/results/nvidia-h200/session15/call5.sh      # carry [".whl"]
set -uo pipefail
mkdir -p $OUT/a $OUT/f
echo "== $(date +%T) ahead-6"
OUT=$OUT/a timeout 120 bash tools/bench_tune.sh ahead-6 2>&1 | tail -4
grep -E "^compil|^start-up|^measured" $OUT/a/ahead-6.log
echo "== $(date +%T) full-both"
OUT=$OUT/f timeout 500 bash tools/bench_tune.sh full-both 2>&1 | tail -30
echo "== $(date +%T) done"
