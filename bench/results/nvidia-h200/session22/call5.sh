#!/usr/bin/env bash
# Session 22, call 5 (one H200): the landed copy-warp kernel profiled (Nsight Compute, 128
# heads b32 x 16,384, 64-token pages, 2 splits), then an A/B of the copy warp's loop with
# each page's id loaded at its copy (.exp/v2: copy-warp-ids-per-page.diff, no spills)
# against the landed one (.exp/v1).
#   OUT=$OUT bash bench/results/nvidia-h200/session22/call5.sh   # carry [".whl", ".exp"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
echo "== $(date +%T) ncu"
timeout 200 "$NCU" --clock-control none --set full --import-source no -k "regex:_gluon_mla_stage1" \
  --launch-skip 2 --launch-count 1 -f -o "$OUT/gluon-p64" python3 tools/ncu_cases.py \
  --case dp64:32,128,1,576,512,16384,p64 > "$OUT/gluon-p64.log" 2>&1
"$NCU" --import "$OUT/gluon-p64.ncu-rep" --page details > "$OUT/gluon-p64.txt" 2>&1
"$NCU" --import "$OUT/gluon-p64.ncu-rep" --page source --csv --print-source sass > "$OUT/gluon-p64.sass.csv" 2>&1
grep -m1 "Duration" "$OUT/gluon-p64.txt"
rm -f "$OUT"/*.ncu-rep
(cd "$OUT" && tar czf ncu.tgz gluon-p64.* && rm -f gluon-p64.*)
echo "== $(date +%T) A/B"
G='{"kernel": "gluon", "num_kv_splits": 2, "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2}'
timeout 150 python3 tools/ab_decode.py --ref-path .exp/v1 --cur-path .exp/v2 \
  --out $OUT/call5-ab.json --rounds 3 --reps 30 --config "$G" \
  --case h128-p16:32,128,1,576,512,16384 --case h128-p64:32,128,1,576,512,16384,p64 \
  --case h16q2-p16:32,16,1,576,512,16384,q2 > $OUT/call5-ab.txt 2>&1; echo "rc $?"
tail -5 $OUT/call5-ab.txt | cut -c1-200
echo "== $(date +%T) done"
