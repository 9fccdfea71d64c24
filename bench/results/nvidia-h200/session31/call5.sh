#!/usr/bin/env bash
# Session 31, call 5 (one H200): narrow_regs.py, an experiment outside the package: the
# narrow fp8 tile with both MMAs' A operands from registers (no fp16 V tiles: 94 KB of
# shared memory, two programs per SM) in place of the package's stage 1, same grid and
# reduce; errors against the fp32 reference (ragged lengths 1-4,096, replay scales 0.02
# and 0.5) beside the package's narrow tile, then graph-replay times, same run.
#   OUT=$OUT bash bench/results/nvidia-h200/session31/call5.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 bench/results/nvidia-h200/session31/narrow_regs.py $OUT/call5-regs.json 2>&1 \
  | grep -v "Warning\|config, outcome\|tuned with other" | tail -30
echo "== done ($SECONDS s)"
