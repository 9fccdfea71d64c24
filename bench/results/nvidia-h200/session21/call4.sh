#!/usr/bin/env bash
# Session 21, call 4 (one H200, Firecracker: ncu reads counters): Nsight Compute's full set
# on the Gluon MLA stage 1 (the third eager call, tools/ncu_cases.py, the re-tuned table's
# config), 128 heads b32 x 16,384 at 16- and 64-token pages: where the 16-token pages'
# extra time per tile goes. Details and SASS source pages come back in ncu.tgz.
#   OUT=$OUT bash bench/results/nvidia-h200/session21/call4.sh      # carry [".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
prof() {  # name kernel-regex case
  timeout 200 "$NCU" --clock-control none --set full --import-source no -k "regex:$2" \
    --launch-skip 2 --launch-count 1 -f -o "$OUT/$1" python3 tools/ncu_cases.py --case "$3" \
    > "$OUT/$1.log" 2>&1
  "$NCU" --import "$OUT/$1.ncu-rep" --page details > "$OUT/$1.txt" 2>&1
  "$NCU" --import "$OUT/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1.sass.csv" 2>&1
  echo "== $(date +%T) $1: $(grep -m1 'Duration' "$OUT/$1.txt")"
}
prof gluon-p16 _gluon_mla_stage1 dp16:32,128,1,576,512,16384
prof gluon-p64 _gluon_mla_stage1 dp64:32,128,1,576,512,16384,p64
rm -f "$OUT"/*.ncu-rep
(cd "$OUT" && tar czf ncu.tgz *.txt *.log *.csv && rm -f *.txt *.log *.csv)
ls -la "$OUT"
