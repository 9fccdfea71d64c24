#!/usr/bin/env bash
# Session 12, the re-tune (one H200): ceilings, the GPU tests (a failure stops the call), then
# every preset's keys tuned over their whole valid space (60 candidates at most), resumed on
# $BASE_DB (carried: the KV-write rows of kernels unchanged since session 10 carry over; the
# decode rows of the old source hash are re-measured), and the export. A tune cut by
# TUNE_MINUTES resumes in the next call with BASE_DB set to this call's h200.sqlite.
#   BASE_DB=.exp/base.sqlite TUNE_MINUTES=6 OUT=$OUT bash bench/results/nvidia-h200/session12/callC.sh
set -uo pipefail
export PRESETS=${PRESETS:-deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b}
export MAX_CANDS=${MAX_CANDS:-60} STATE=/tmp/callC-state
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
bash tools/gpu_session.sh ${PHASES:-tests,tune}
cp "$OUT/session.log" "$OUT/callC-session.log" 2>/dev/null; rm -f "$OUT/session.log"
