#!/usr/bin/env bash
# Session 11's profiling call (nvidia-h200-x2, a Firecracker host: ncu reads counters there):
# Nsight Compute's full set on the third eager call of each case (tools/ncu_cases.py),
# cases split over the two GPUs; the details pages come back as text in ncu.tgz.
set -uo pipefail
OUT=${OUT:-$PWD/ncu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
echo "ncu: $NCU"
prof() {  # gpu name kernel-regex case
  CUDA_VISIBLE_DEVICES=$1 timeout 150 "$NCU" --clock-control none --set full -k "regex:$3" \
    --launch-skip 2 --launch-count 1 -f -o "$OUT/$2" python3 tools/ncu_cases.py --case "$4" \
    > "$OUT/$2.log" 2>&1
  "$NCU" --import "$OUT/$2.ncu-rep" --page details > "$OUT/$2.txt" 2>&1
  "$NCU" --import "$OUT/$2.ncu-rep" --page source --csv --print-source sass > "$OUT/$2.sass.csv" 2>&1
  echo "== $(date +%T) $2: $(grep -m1 'Duration' "$OUT/$2.txt")"
}
(
  prof 0 write-bf16 _kv_write write:1,16,128
  prof 0 write-fp8 _kv_write write:1,16,128,fp8
  prof 0 gqa-bf16 '^_decode_stage1$' llama:4,32,8,128,128,262144
  prof 0 gqa-fp8 '^_decode_stage1$' llama:4,32,8,128,128,262144,fp8
) &
(
  prof 1 mla16 _decode_stage1_latent ds:32,16,1,576,512,16384
  prof 1 mla16-q2 _decode_stage1_latent ds:32,16,1,576,512,16384,q2
  prof 1 mla16-fp8 _decode_stage1_latent ds:32,16,1,576,512,16384,fp8
  prof 1 mla128 _decode_stage1_latent dp:32,128,1,576,512,16384
) &
wait
rm -f "$OUT"/*.ncu-rep
(cd "$OUT" && tar czf ncu.tgz *.txt *.log *.csv && rm -f *.txt *.log *.csv)
ls -la "$OUT"
