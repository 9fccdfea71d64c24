#!/usr/bin/env bash
# Session 14, call 3 (one H200): the re-tune resumed on call 2's database (.exp/call2.sqlite)
# to its end and exported; with the new table in db/, the decode benchmark of the
# Performance page's shapes; then issue 20's one-GPU tune time with keys described while
# the GPU times (bench_tune.sh ahead-6, empty Triton cache).
#   OUT=$OUT bash bench/results/nvidia-h200/session14/call3.sh
#   # carry [".whl", ".exp/call2.sqlite"]
set -uo pipefail
export PYTHONUNBUFFERED=1
FINAL=$OUT; RAW=/tmp/call3; mkdir -p $RAW
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
(export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
 export MAX_CANDS=60 STATE=/tmp/call3-state BASE_DB=.exp/call2.sqlite TUNE_MINUTES=${TUNE_MINUTES:-2.5}
 bash tools/gpu_session.sh tune)
cp $FINAL/nvidia-h200.json db/nvidia-h200.json
mv $FINAL/session.log $RAW/call3-session.log; mv $FINAL/tune.txt $RAW/call3-tune.txt
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) decode benchmark"
timeout 150 python3 tools/bench_decode.py --max-cands 2 --time-limit 125 --shapes \
  kimi-k3-mla-b8-c327600,deepseek-v3-tp8-mla-b32-c16384,llama3-8b-gqa-long,llama3-8b-gqa-b64-c8192,deepseek-v3-tp1,ragged-b128-m16384 \
  --out "$RAW/decode.json" 2>&1 | tail -30
echo "== $(date +%T) tune time"
(OUT=$RAW timeout 120 bash tools/bench_tune.sh ahead-6 2>&1 | tail -8)
grep -E "^compil|^start-up|^measured" $RAW/ahead-6.log
tar czf $FINAL/call3.tgz -C $RAW .
echo "== $(date +%T) done"
