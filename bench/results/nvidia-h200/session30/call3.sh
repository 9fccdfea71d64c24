#!/usr/bin/env bash
# (Runs on branch narrow-fp8's tree: narrow-fp8.diff here.)
# Session 30, call 3 (one H200): the narrow fp8 MLA tile as landed (gluon_mla_narrow, skewed:
# the PV MMA of tile i - 1 under tile i's scores and conversion; decode hash moved).
# (1) narrow_check.py: through the public op with its config, errors vs the fp32 reference
# at lengths around page and tile boundaries (bits stable run to run), then graph-replay
# times against the table (stale: the heuristic's configs) and bf16, 2 alternating rounds;
# (2) the Gluon and work-plan GPU tests; (3) decode re-tuned (every preset's decode keys, 8
# candidates a key, on session 29's database: its kv_write rows are current) and exported.
#   OUT=$OUT bash bench/results/nvidia-h200/session30/call3.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) narrow_check"
timeout 110 python3 bench/results/nvidia-h200/session30/narrow_check.py --out $OUT/call3-narrow.json 2>&1 \
  | grep -v "Warning\|config, outcome" | grep -v "^check.*stable True" | tail -60
echo "== $(date +%T) GPU tests ($SECONDS s in)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gluon_gpu.py \
  tests/gpu/test_work_plan_gpu.py > $OUT/call3-gpu-tests.txt 2>&1
rc=$?; echo "rc $rc"; grep -E "FAILED|Error|passed|failed" $OUT/call3-gpu-tests.txt | tail -8 | cut -c1-300
echo "== $(date +%T) tune ($SECONDS s in)"
export MAX_CANDS=8 STATE=/tmp/s30-state BASE_DB=bench/results/nvidia-h200/session29/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=$(python3 -c "print(round((570 - $SECONDS) / 60 - 0.5, 1))") bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call3-session.log"; mv "$OUT/tune.txt" "$OUT/call3-tune.txt"
ls -la $OUT
echo "== $(date +%T) done ($SECONDS s)"
