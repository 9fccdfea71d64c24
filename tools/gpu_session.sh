#!/usr/bin/env bash
# One device call on the H200: ceilings, GPU-marked tests, tune every preset into a fresh
# database, export the shipped table, the KV-write and decode benchmarks,
# and the tuning report. Everything lands under $OUT (at most 8 files come back).
#
#   bash tools/gpu_session.sh            (on the device machine, from the repo root)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LOG="$OUT/session.log"
if ls .whl/*.whl >/dev/null 2>&1; then   # the GPU image lacks pydantic and sqlalchemy
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export KDISPATCH_DB="$OUT/h200.sqlite"
TUNE_MINUTES=${TUNE_MINUTES:-3.3}
MAX_CANDS=${MAX_CANDS:-6}
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

step "device"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOG"
step "ceilings"; python3 tools/ceilings.py --out "$OUT/ceilings.json" 2>&1 | tee -a "$LOG"
step "gpu tests"; timeout 150 python3 -m pytest -q -m gpu -p no:warnings tests 2>&1 | tail -25 | tee -a "$LOG"
step "tune"; python3 -m kdispatch.cli tune --device cuda:0 \
  --preset kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn \
  --max-candidates "$MAX_CANDS" --budget-minutes "$TUNE_MINUTES" --db "$KDISPATCH_DB" 2>&1 \
  | tail -60 | tee -a "$LOG"
step "export"; python3 -m kdispatch.cli export --device nvidia-h200 -o "$OUT/nvidia-h200.json" \
  --db "$KDISPATCH_DB" 2>&1 | tee -a "$LOG"
step "kv_write bench"; timeout 90 python3 tools/bench_kv_write.py --out "$OUT/kv_write.json" 2>&1 \
  | tail -20 | tee -a "$LOG"
step "decode bench (every BENCHMARKING.md shape: split 1, heuristic, best of 3)"
timeout 110 python3 tools/bench_decode.py --max-cands 3 --time-limit 80 \
  --out "$OUT/decode.json" 2>&1 | tail -30 | tee -a "$LOG"
step "report"; python3 tools/report_tuning.py --db "$KDISPATCH_DB" --ceilings "$OUT/ceilings.json" \
  --json "$OUT/tuning.json" --md "$OUT/tuning.md" 2>&1 | tail -45 | tee -a "$LOG"
step "compact the database"  # one file back: no -wal/-shm/.lock beside it
python3 - "$KDISPATCH_DB" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
con.execute("PRAGMA journal_mode=DELETE")
con.close()
PY
rm -f "$KDISPATCH_DB-wal" "$KDISPATCH_DB-shm" "$KDISPATCH_DB.lock"
ls -la "$OUT" | tee -a "$LOG"
step "done"
