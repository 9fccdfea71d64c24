#!/usr/bin/env bash
# Session 14, call 2 (one H200): the tree with the narrow latent tile's clean-split loads
# (call 1: 0.986 of its guard-free build at kimi 12 heads): the Gluon check's correctness
# phase, then ceilings, every GPU test (a failure stops the call) and the re-tune of every
# preset's keys over their whole valid space (60 candidates at most) resumed on session
# 13's database (its KV-write rows carry: kv_write's source is unchanged; the decode rows
# are re-measured: the decode source hash changed), cut by TUNE_MINUTES and resumed in
# call 3, which exports.
#   BASE_DB=bench/results/nvidia-h200/session13/h200.sqlite TUNE_MINUTES=5 TEST_SECONDS=170 \
#     OUT=$OUT bash bench/results/nvidia-h200/session14/call2.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset PYTHONDONTWRITEBYTECODE TRITON_INTERPRET
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
if [ -n "${GLUON_CHECK-1}" ]; then
  echo "== $(date +%T) gluon check (correctness)"
  mkdir -p /tmp/no-tables
  (export PYTHONPATH=/tmp/site:$PWD KDISPATCH_TABLE_DIR=/tmp/no-tables KDISPATCH_DB=sqlite:////tmp/c2.sqlite
   timeout 90 python3 tools/gluon_mla_check.py --phases correct --pages 16,32,64 --shapes all \
     --budget 80 > /tmp/gluon-check.txt 2>&1; echo "rc $?")
  grep -E "SUMMARY|rror|FAIL" /tmp/gluon-check.txt | tail -12
  grep -q "failed: \[\]" /tmp/gluon-check.txt && grep -q "SUMMARY errors: \[\]" /tmp/gluon-check.txt || { echo "== gluon check failed: no tuning"; exit 3; }
fi
export PRESETS=${PRESETS:-deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b}
export MAX_CANDS=${MAX_CANDS:-60} STATE=/tmp/call2-state
bash tools/gpu_session.sh ${PHASES:-tests,tune}
cp "$OUT/session.log" "$OUT/call2-session.log" 2>/dev/null; rm -f "$OUT/session.log"
