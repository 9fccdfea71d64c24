#!/usr/bin/env bash
# Session 28, call 6 (one H200, the session's last ~4 device minutes): call 5 traced the fp8
# narrow latent tile's bank conflicts to its fp16 staging stores (STS.128, 8 wavefronts a
# request where 4 would do: each thread held 16 converted values, two 16-byte chunks, so a
# quarter warp's lanes hit 4 of the 8 chunk slots). The patch (.exp/conflict: fp8 tiles
# loaded in 8-byte runs, tl.max_contiguous, in the latent stage 1 and the GQA V tile) gives
# each thread one chunk. Same-run A/B against main's tree, heuristic configs; not landed.
#   OUT=$OUT bash bench/results/nvidia-h200/session28/call6.sh
#   # carry [".whl", ".exp/ab-ref", ".exp/conflict"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
unset TRITON_INTERPRET KDISPATCH_FAST_OPS
timeout 170 python3 tools/ab_decode.py --ref-path .exp/ab-ref --cur-path .exp/conflict \
  --out $OUT/call6-ab-conflict.json --rounds 2 \
  --case kimi-fp8:8,12,1,576,512,327600,fp8 --case ds-tp8-fp8:32,16,1,576,512,16384,fp8 \
  --case llama-b4-fp8:4,32,8,128,128,262144,fp8 2>&1 | grep -v Warning
echo "== done ($SECONDS s)"
