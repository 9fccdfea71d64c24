#!/usr/bin/env bash
# Session 28, call 5 (one H200): call 4 found the fp8 narrow latent stage 1 (Kimi-K3 TP8,
# 12 heads, b8 x 327,600) bound by L1/shared memory (81% L1/TEX, 36% DRAM) with 54% of its
# 51M shared-store wavefronts bank conflicts (bf16: none). The same profile, its SASS source
# counters exported (which instructions conflict).
#   OUT=$OUT bash bench/results/nvidia-h200/session28/call5.sh   # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 150 "$NCU" --clock-control none --set full --import-source no -k "regex:_decode_stage1_latent" \
  --launch-skip 2 --launch-count 1 -f -o "$OUT/kimi-fp8" python3 tools/ncu_cases.py \
  --case kimi:8,12,1,576,512,327600,fp8 > "$OUT/kimi-fp8.log" 2>&1
"$NCU" --import "$OUT/kimi-fp8.ncu-rep" --page source --csv --print-source sass > "$OUT/kimi-fp8.sass.csv" 2>&1
head -c 600 "$OUT/kimi-fp8.sass.csv"; echo
rm -f "$OUT/kimi-fp8.ncu-rep"
(cd "$OUT" && tar czf call5-ncu-source.tgz kimi-fp8.* && rm -f kimi-fp8.*)
echo "== done ($SECONDS s)"
