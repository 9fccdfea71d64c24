#!/usr/bin/env bash
# Session 28, call 4 (one H200): Nsight Compute on the narrow latent stage 1 (Kimi-K3 TP8,
# 12 heads, b8 x 327,600, the table's config) with an fp8 and a bf16 cache: is the fp8
# tile bound by shared memory (the compile-time count: 12.0 bytes of shared-memory traffic
# per cache byte, bf16 5.2)? Then the GPU tests call 1 did not run (KV writes, the native
# launch cache, memo guard, the GPU tune, memory safety, torch).
#   OUT=$OUT bash bench/results/nvidia-h200/session28/call4.sh   # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for kv in fp8 bf16; do
  flag=""; [ $kv = fp8 ] && flag=",fp8"
  echo "== $(date +%T) ncu kimi $kv"
  timeout 150 "$NCU" --clock-control none --set full --import-source no -k "regex:_decode_stage1_latent" \
    --launch-skip 2 --launch-count 1 -f -o "$OUT/kimi-$kv" python3 tools/ncu_cases.py \
    --case kimi:8,12,1,576,512,327600$flag > "$OUT/kimi-$kv.log" 2>&1
  "$NCU" --import "$OUT/kimi-$kv.ncu-rep" --page details > "$OUT/kimi-$kv.txt" 2>&1
  grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|Executed Ipc Active|Registers Per Thread|Shared Memory Configuration Size|Achieved Occupancy|Theoretical Occupancy)\b" "$OUT/kimi-$kv.txt" | head -12
  grep -iE "shared|mio|lsu" "$OUT/kimi-$kv.txt" | grep -v "^\s*$" | head -14 | cut -c1-160
  rm -f "$OUT/kimi-$kv.ncu-rep"
done
(cd "$OUT" && tar czf call4-ncu.tgz kimi-* && rm -f kimi-*)
echo "== $(date +%T) GPU tests ($SECONDS s in)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/gpu/test_kv_write_gpu.py \
  tests/gpu/test_kv_write_fp8_gpu.py tests/gpu/test_native_gpu.py tests/gpu/test_memo_guard_gpu.py \
  tests/gpu/test_tune_gpu.py tests/test_memory_safety.py tests/torch > $OUT/call4-gpu-tests.txt 2>&1
echo "rc $?"; tail -2 $OUT/call4-gpu-tests.txt | cut -c1-300
echo "== $(date +%T) done ($SECONDS s)"
