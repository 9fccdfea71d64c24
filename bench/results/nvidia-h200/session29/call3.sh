#!/usr/bin/env bash
# Session 29, call 3 (one H200): the plan's stage 1 runs ~7.5% more SM cycles a tile than
# the split grid's on the same work (call 2: full context b32 x 16,384 at 128 heads, the
# plan forced to 64 parts, one segment a program). Nsight Compute on both (HEAD's kernels),
# the full set with source counters: details, the stall metrics, and the per-instruction
# samples of the SASS.
#   OUT=$OUT bash bench/results/nvidia-h200/session29/call3.sh
#   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for c in s2 p64; do
  echo "== $(date +%T) ncu $c"
  timeout 200 "$NCU" --clock-control none --set full --import-source no -k "regex:_gluon_mla_stage1" \
    --launch-skip 2 --launch-count 1 -f -o "$OUT/full-$c" python3 \
    bench/results/nvidia-h200/session29/ncu_plan_case.py --config $c > "$OUT/full-$c.log" 2>&1
  echo "rc $?"; tail -2 "$OUT/full-$c.log"
  "$NCU" --import "$OUT/full-$c.ncu-rep" --page details > "$OUT/full-$c.txt" 2>&1
  "$NCU" --import "$OUT/full-$c.ncu-rep" --page raw --csv > "$OUT/full-$c-raw.csv" 2>&1
  "$NCU" --import "$OUT/full-$c.ncu-rep" --page source --csv --print-source sass > "$OUT/full-$c-sass.csv" 2>&1
  grep -E "^\s+(Duration|SM Frequency|Elapsed Cycles|DRAM Throughput|L2 Hit Rate|L1/TEX Hit Rate|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued Instruction)\b" "$OUT/full-$c.txt" | head -12
  ls -la "$OUT"/full-$c*
done
(cd "$OUT" && tar czf call3-ncu.tgz full-* && rm -f full-*)
ls -la $OUT
echo "== $(date +%T) done ($SECONDS s)"
