#!/usr/bin/env bash
# Session 16, call 1 (one H200): decode configs on full-context and ragged lengths (every
# shape beside its length twin, the tuner's 12 candidates; twins_report.py reads it), and
# torch's per-call charge for a no-op op by registration style (op_floor.py).
#   OUT=$OUT bash bench/results/nvidia-h200/session16/call1.sh      # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
D=bench/results/nvidia-h200/session16
timeout 60 python3 $D/op_floor.py > $OUT/op-floor.txt 2>&1; tail -12 $OUT/op-floor.txt
run() {  # name, shapes, time limit
  timeout $(( $3 + 90 )) python3 tools/bench_decode.py --twins --kv bf16 --q-len 1 \
    --max-cands 12 --shapes "$2" --time-limit $3 --out $OUT/call1-twins-$1.json \
    > $OUT/call1-twins-$1.log 2>&1
  tail -3 $OUT/call1-twins-$1.log
  python3 $D/twins_report.py $OUT/call1-twins-$1.json
}
run dp deepseek-v3-dp-ragged-b128-m16384,deepseek-v3-tp1-mla-b32-c16384 150
run mla deepseek-v3-tp8-mla-b32-c16384,kimi-k3-mla-b8-c327600 100
run gqa llama3-8b-gqa-b64-c8192,llama3-8b-gqa-b8-c32768,llama3-8b-gqa-b64-c32768,llama3-8b-gqa-b8-c131072 150
