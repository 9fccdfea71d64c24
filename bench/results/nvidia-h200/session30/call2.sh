#!/usr/bin/env bash
# (Ran a draft of gluon_mla_narrow.py that was not kept: branch narrow-fp8 holds its successor.)
# Session 30, call 2 (one H200): the narrow fp8 MLA tile at 4 and 8 warps (two warpgroups),
# against the table's configs, same run: errors vs the fp32 reference on ragged lengths
# around page and tile boundaries, then graph-replay times (2 alternating rounds).
#   OUT=$OUT bash bench/results/nvidia-h200/session30/call2.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
timeout 560 python3 bench/results/nvidia-h200/session30/narrow_draft.py --out $OUT/call2-narrow.json --rounds 2
echo "== done ($SECONDS s)"
