#!/usr/bin/env bash
# Session 23, call 9 (one H200): Nsight Compute on the seesaw, 128 heads b32 x 16,384, the
# heuristic's 2 splits: the landed seesaw at 64-token pages (this tree), and at 16-token
# pages the prepared block-copy seesaw (.exp/stream: seesaw-blocks.diff, the seesaw at
# every bf16 page size), where it runs at the other form's time: per-instruction stall
# samples of both, for the next step at 16-token pages.
#   OUT=$OUT bash bench/results/nvidia-h200/session23/call9.sh   # carry [".whl", ".exp"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
prof() {  # name, tree, case
  echo "== $(date +%T) ncu $1"
  PYTHONPATH=/tmp/site:$2 timeout 90 "$NCU" --clock-control none --set full --import-source no \
    -k "regex:_gluon_mla_stage1" --launch-skip 2 --launch-count 1 -f -o "$OUT/$1" \
    python3 $2/tools/ncu_cases.py --case "$3" > "$OUT/$1.log" 2>&1
  "$NCU" --import "$OUT/$1.ncu-rep" --page details > "$OUT/$1.txt" 2>&1
  "$NCU" --import "$OUT/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1.sass.csv" 2>&1
  grep -m1 "Duration" "$OUT/$1.txt"
  rm -f "$OUT/$1.ncu-rep"
}
prof seesaw-p64 $PWD dp64:32,128,1,576,512,16384,p64
prof blocks-p16 $PWD/.exp/stream dp16:32,128,1,576,512,16384
(cd "$OUT" && tar czf ncu.tgz seesaw-p64.* blocks-p16.* && rm -f seesaw-p64.* blocks-p16.*)
echo "== $(date +%T) done"
