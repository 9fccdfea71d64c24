#!/usr/bin/env bash
# One device call on the H200: ceilings, GPU-marked tests (a failure stops the call before
# any tuning), tune every preset, export the shipped table, the KV-write and decode
# benchmarks, and the tuning report of this call's run. Everything lands under $OUT (at
# most 8 files come back).
#
#   bash tools/gpu_session.sh            (on the device machine, from the repo root)
#   BASE_DB=bench/results/nvidia-h200/session4/h200.sqlite bash tools/gpu_session.sh
#       resumes on a committed database: only candidates it lacks for today's kernels
#       are measured, and the export keeps the best of every run.
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
if [ -n "${BASE_DB:-}" ]; then install -m 644 "$BASE_DB" "$KDISPATCH_DB" || exit 1; fi
TUNE_MINUTES=${TUNE_MINUTES:-5.5}  # 22 decode keys x 12 candidates took 4 min + one key (session 5)
MAX_CANDS=${MAX_CANDS:-12}
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

step "device"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOG"
step "ceilings"; python3 tools/ceilings.py --out "$OUT/ceilings.json" 2>&1 | tee -a "$LOG"
step "gpu tests"
timeout 150 python3 -m pytest -q -m gpu -p no:warnings tests > /tmp/gpu-tests.txt 2>&1
rc=$?
tail -25 /tmp/gpu-tests.txt | tee -a "$LOG"
[ $rc -eq 0 ] || { step "GPU tests failed: no tuning"; exit 3; }
FIRST_RUN=$(python3 - "$KDISPATCH_DB" <<'PY'
import os, sqlite3, sys
if not os.path.exists(sys.argv[1]):
    print(1)
else:
    print((sqlite3.connect(sys.argv[1]).execute("select max(id) from kd_runs").fetchone()[0] or 0) + 1)
PY
)
step "tune"; python3 -m kdispatch.cli tune --device cuda:0 \
  --preset kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn \
  --max-candidates "$MAX_CANDS" --budget-minutes "$TUNE_MINUTES" --db "$KDISPATCH_DB" 2>&1 \
  | tail -60 | tee -a "$LOG"
step "export"; python3 -m kdispatch.cli export --device nvidia-h200 -o "$OUT/nvidia-h200.json" \
  --db "$KDISPATCH_DB" 2>&1 | tee -a "$LOG"
cp "$OUT/nvidia-h200.json" db/nvidia-h200.json  # the benchmarks resolve from the new table
step "kv_write bench"; timeout 90 python3 tools/bench_kv_write.py --out "$OUT/kv_write.json" 2>&1 \
  | tail -20 | tee -a "$LOG"
step "decode bench (every BENCHMARKING.md shape: split 1, heuristic, best of 3)"
timeout 110 python3 tools/bench_decode.py --max-cands 3 --time-limit 80 \
  --out "$OUT/decode.json" 2>&1 | tail -30 | tee -a "$LOG"
step "report (runs >= $FIRST_RUN)"; python3 tools/report_tuning.py --db "$KDISPATCH_DB" \
  --ceilings "$OUT/ceilings.json" --min-run "$FIRST_RUN" \
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
