#!/usr/bin/env bash
# Session 14, call 7 (one H200): the first seconds of a one-GPU tune (issue 20), as
# bench_tune.sh ahead-6 runs it (llama3-8b, 6 candidates per key, empty Triton cache, fresh
# database, bytecode cached first) with tune_timeline.py's timestamps.
#   OUT=$OUT bash bench/results/nvidia-h200/session14/call7.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
python3 -c "import kdispatch.cli.tune, kdispatch.tuning.parallel, kdispatch.tuning.sweep, \
kdispatch.tuning.precompile as p, rich.progress; p.warm_up()" || exit 1
for i in 1 2; do
  echo "== $(date +%T) timeline $i"
  export TRITON_CACHE_DIR=/tmp/tl-cache-$i
  timeout 120 python3 bench/results/nvidia-h200/session14/tune_timeline.py --device cuda:0 \
    --preset llama3-8b --max-candidates 6 --db /tmp/tl-$i.sqlite > $OUT/call7-timeline-$i.txt 2>&1
  echo "rc $?"; grep -E "^ +[0-9.]+ s  |^compile|^start-up|^compiling" $OUT/call7-timeline-$i.txt
done
echo "== $(date +%T) done"
