#!/usr/bin/env bash
# Session 28, call 1 (one H200): the decode code's hash-bound cleanups (the Gluon tile's
# constants in one place, the lap helper, _free_q shared; no kernel change: every Gluon
# variant compiles to the same registers, spills, wgmma and barrier counts) changed the
# decode source hash. The decode GPU tests (Gluon tile, decode, work plan, fp8 / multi-
# token); same-run A/B against HEAD's tree at the heuristic and the plan (the cleanup
# costs nothing), with fp8 GQA at 1- and 2-warp tiles beside the heuristic's (issue 17:
# fp8 GQA holds two programs of 4 warps per SM); then the re-tune of the MLA presets' decode
# keys, 8 candidates a key, on session 27's database (its kv_write rows are current; call 2
# resumes on the rest).
#   OUT=$OUT bash bench/results/nvidia-h200/session28/call1.sh
#   # carry [".whl", ".exp/ab-ref"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
echo "== $(date +%T) decode GPU tests"
timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gluon_gpu.py \
  tests/gpu/test_decode_attention_gpu.py tests/gpu/test_work_plan_gpu.py \
  tests/gpu/test_fp8_mtp_gpu.py > $OUT/call1-gpu-tests.txt 2>&1
rc=$?; echo "rc $rc"; tail -3 $OUT/call1-gpu-tests.txt | cut -c1-400
[ $rc -eq 0 ] || exit 1
echo "== $(date +%T) A/B against HEAD ($SECONDS s in)"
G='"kernel": "gluon", "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2'
timeout 100 python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call1-ab-mla.json --rounds 2 \
  --case ds-tp1-p64:32,128,1,576,512,16384,p64 --case ds-rag-b128:128,128,1,576,512,16384,rag,p64 \
  --config heuristic --config "{$G, \"num_kv_splits\": 1, \"plan\": true}" 2>&1 | grep -v Warning
T='"block_h": 16, "num_kv_splits": 8, "pdl": false, "merge": false'
timeout 100 python3 tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/call1-ab-gqa-fp8.json --rounds 2 \
  --case llama-b4-fp8:4,32,8,128,128,262144,fp8 --config heuristic \
  --config "{$T, \"block_n\": 64, \"num_warps\": 2, \"num_stages\": 3}" \
  --config "{$T, \"block_n\": 128, \"num_warps\": 2, \"num_stages\": 2}" \
  --config "{$T, \"block_n\": 32, \"num_warps\": 1, \"num_stages\": 3}" \
  --config "{$T, \"block_n\": 64, \"num_warps\": 1, \"num_stages\": 2}" 2>&1 | grep -v Warning
left=$(( 570 - SECONDS ))
echo "== $(date +%T) tune ($left s left)"
export MAX_CANDS=8 STATE=/tmp/s28-state BASE_DB=bench/results/nvidia-h200/session27/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=$(python3 -c "print(round(($left - 40) / 60, 1))") bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call1-session.log"; mv "$OUT/tune.txt" "$OUT/call1-tune.txt"
echo "== $(date +%T) done ($SECONDS s)"
