#!/usr/bin/env bash
# Session 23, call 7 (one H200): tools/bench_decode.py on the re-tuned table (call 5's
# export, installed as db/nvidia-h200.json) for the rows the seesaw serves: DeepSeek-V3's
# DP-attention ragged batches (128 heads x batch 128, 64-token pages), with the read
# ceiling of the same run.
#   OUT=$OUT bash bench/results/nvidia-h200/session23/call7.sh   # carry [".whl", ".exp"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl || exit 1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
export PYTHONPATH=/tmp/site:$PWD
python3 tools/ceilings.py --out $OUT/call7-ceilings.json 2>&1 | tail -1
timeout 230 python3 tools/bench_decode.py --shapes deepseek-v3-dp-ragged --kv bf16 \
  --max-cands 3 --time-limit 150 --out $OUT/call7-decode.json > $OUT/call7-decode.txt 2>&1
echo "rc $?"; tail -12 $OUT/call7-decode.txt | cut -c1-220
