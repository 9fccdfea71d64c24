#!/usr/bin/env bash
# Session 25, call 2 (one H200).
# 1. The seesaw with early release (.exp/seesaw2; decode_notes v25): the Gluon GPU tests on
#    its tree, then tools/ab_decode.py against this tree (session 23's kernels; each output
#    checked against the fp32 reference first); the same A/B for .exp/seesaw2sf (P_B stored
#    before warpgroup 1's PV MMA of B is issued, not while it runs: no register of an
#    in-flight wgmma read).
# 2. Where the fp8 writer's time goes: tools/bench_kv_write.py (heuristic configs; each run
#    times its fp8 writer against its bf16 one) on this tree (also an fp8 cache without
#    scales: the conversion without the division) and on three experiment trees, each this
#    tree's writer with one part of the division taken out (their bytes differ from IEEE
#    division at some scales; timing only): .exp/w-nopre (no pre-scaling of extreme
#    scales), .exp/w-nospecial (no zero / infinite scale handling), .exp/w-mulonly (x times
#    the MUFU reciprocal: no correction at all); alternating, twice (time allowing).
# 3. The huginn (55 x 96) and ouro-1.4b (16 x 128) writer keys over their full candidate
#    spaces (a database of its own), time allowing: the fp8 rules of one-token writes and
#    of decode-step writes over 55 heads.
#   OUT=$OUT bash bench/results/nvidia-h200/session25/call2.sh
#   # carry [".whl", ".exp/w-nopre", ".exp/w-nospecial", ".exp/w-mulonly", ".exp/seesaw2",
#   #        ".exp/seesaw2sf"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/b
echo "== $(date +%T) seesaw2: Gluon GPU tests on its tree"
( cd .exp/seesaw2 && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider \
    -m gpu tests/gpu/test_gluon_gpu.py > $OUT/call2-seesaw2-tests.txt 2>&1; echo "rc $?" )
tail -3 $OUT/call2-seesaw2-tests.txt | cut -c1-200
G='{"kernel": "gluon", "num_kv_splits": 2, "block_n": 64, "block_h": 64, "num_warps": 8, "num_stages": 2}'
for tree in seesaw2 seesaw2sf; do
  echo "== $(date +%T) A/B: .exp/$tree against this tree (session 23's kernels)"
  timeout 170 python3 tools/ab_decode.py --ref-path . --cur-path .exp/$tree \
    --out /tmp/b/call2-ab-$tree.json --rounds 3 --reps 20 --config "$G" \
    --case h128-p64:32,128,1,576,512,16384,p64 --case h128-p16:32,128,1,576,512,16384 \
    --case h16q2-p16:32,16,1,576,512,16384,q2 --case h16q2-p64:32,16,1,576,512,16384,q2,p64 \
    --case rag128-p64:128,128,1,576,512,32768,rag,p64 \
    --case rag128-p16:128,128,1,576,512,32768,rag > /tmp/b/call2-ab-$tree.txt 2>&1
  echo "rc $?"; tail -9 /tmp/b/call2-ab-$tree.txt | cut -c1-200
done
echo "== $(date +%T) writer decomposition"
for i in 1 2; do
  [ $SECONDS -gt 420 ] && break
  for tree in cur nopre nospecial mulonly; do
    dir=.; kv=bf16,fp8,fp8-unscaled
    [ $tree != cur ] && { dir=.exp/w-$tree; kv=bf16,fp8; }
    timeout 100 python3 $dir/tools/bench_kv_write.py --kv $kv \
      --out /tmp/b/call2-kv_write-$tree-$i.json > /tmp/b/call2-kv_write-$tree-$i.txt 2>&1
    echo "$tree $i rc $?"; grep -E "/ bf16 fused" /tmp/b/call2-kv_write-$tree-$i.txt
  done
done
left=$(( 560 - SECONDS ))
echo "== $(date +%T) huginn and ouro writer keys, full spaces ($left s)"
[ $left -ge 60 ] && KDISPATCH_DB=/tmp/b/writer-full.sqlite timeout $left python3 -m kdispatch.cli tune --device cuda:0 \
  --preset huginn,ouro-1.4b --op kv_write --max-candidates all --budget-minutes $(python3 -c "print(max(0.1, ($left - 25) / 60))") \
  > /tmp/b/call2-writer-tune.txt 2>&1
echo "rc $?"; tail -4 /tmp/b/call2-writer-tune.txt | cut -c1-200
tar -C /tmp/b -czf $OUT/call2.tgz .
echo "== $(date +%T) done"
