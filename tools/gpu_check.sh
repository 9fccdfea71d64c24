#!/usr/bin/env bash
# A short device call: the source hashes under the GPU's Python (they must equal the CPU's),
# the GPU-marked tests of the torch face and of memory safety, and the host-cost benchmark.
#   bash tools/gpu_check.sh            (on the device machine, from the repo root)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then   # the GPU image lacks pydantic and sqlalchemy
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
fi
python3 - <<'PY' | tee "$OUT/hashes.txt"
import sys, kdispatch, kdispatch_example_ops  # noqa: F401
print("python", sys.version.split()[0])
for name in ("decode_attention", "kv_write", "example.rmsnorm", "example.softmax"):
    print(name, kdispatch.get_op(name).source_hash())
PY
timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_torch_gpu.py \
  tests/torch tests/test_memory_safety.py tests/test_hardening_serving.py 2>&1 \
  | tail -30 | tee "$OUT/tests.txt"
timeout 150 python3 tools/bench_host.py --out "$OUT/host.json" 2>&1 | tail -22
