#!/usr/bin/env bash
# Session 25, call 4 (one H200, call 3's machine still warm): call 3's decode re-tune had
# stopped at its 4.4-minute budget with 57 of the 120 decode keys left; resumed from its
# state (/tmp/s25-state, the pool's compiled kernels cached), 2.4 minutes, exported.
#   OUT=$OUT bash bench/results/nvidia-h200/session25/call4.sh   # carry [".whl"]
export PYTHONPATH=/tmp/site:$PWD WHEELS_INSTALLED=1 MAX_CANDS=12 STATE=/tmp/s25-state
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
ls $STATE
TUNE_MINUTES=2.4 bash tools/gpu_session.sh tune 2>&1 | tail -5
mv $OUT/session.log $OUT/call4-session.log; mv $OUT/tune.txt $OUT/call4-tune.txt
