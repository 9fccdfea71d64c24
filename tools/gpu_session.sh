#!/usr/bin/env bash
# The H200 session, in phases that each fit one device call (10 minutes):
#
#   bash tools/gpu_session.sh tests,tune     ceilings, the GPU tests (a failure stops the
#                                            call before tuning), tune every preset, export
#   bash tools/gpu_session.sh bench          host cost, KV-write and decode benchmarks,
#                                            the tuning report, the example package's table
#
# Everything lands under $OUT (at most 8 files come back). The tuning database lives in
# $STATE (an ignored folder that survives between calls while the machine stays warm) and
# is copied to $OUT after the tune; BASE_DB=path resumes on a committed database.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
STATE=${STATE:-$PWD/.gpu-state}
mkdir -p "$OUT" "$STATE"
PHASES=${1:-tests,tune}
LOG="$OUT/session.log"
if ls .whl/*.whl >/dev/null 2>&1; then   # the GPU image lacks pydantic and sqlalchemy
  if [ -z "${WHEELS_INSTALLED:-}" ]; then  # set by a caller that installed them already
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site:$PWD:$PWD/examples/kdispatch_example_ops
fi
unset TRITON_INTERPRET
export KDISPATCH_DB="$STATE/h200.sqlite"
if [ -n "${BASE_DB:-}" ] && [ ! -f "$KDISPATCH_DB" ]; then install -m 644 "$BASE_DB" "$KDISPATCH_DB" || exit 1; fi
TUNE_MINUTES=${TUNE_MINUTES:-5}
MAX_CANDS=${MAX_CANDS:-12}
PRESETS=${PRESETS:-kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,deepseek-v3-dp}
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
has() { case ",$PHASES," in *",$1,"*) return 0;; esac; return 1; }

step "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | head -1)"
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOG"

if has tests; then
  step "ceilings"; python3 tools/ceilings.py --out "$OUT/ceilings.json" 2>&1 | tail -3 | tee -a "$LOG"
  cp "$OUT/ceilings.json" "$STATE/ceilings.json"
  step "gpu tests"
  timeout ${TEST_SECONDS:-270} python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests \
    tests/torch tests/test_memory_safety.py > "$OUT/gpu-tests.txt" 2>&1
  rc=$?
  tail -15 "$OUT/gpu-tests.txt" | tee -a "$LOG"
  [ $rc -eq 0 ] || { step "GPU tests failed (rc $rc): no tuning"; exit 3; }
fi

if has tune; then
  FIRST_RUN=$(python3 - "$KDISPATCH_DB" <<'PY'
import os, sqlite3, sys
p = sys.argv[1]
print((sqlite3.connect(p).execute("select max(id) from kd_runs").fetchone()[0] or 0) + 1
      if os.path.exists(p) else 1)
PY
)
  echo "$FIRST_RUN" > "$STATE/first_run"
  step "tune ($PRESETS, $MAX_CANDS candidates per key, $TUNE_MINUTES min)"
  python3 -m kdispatch.cli tune --device cuda:0 --preset "$PRESETS" \
    --max-candidates "$MAX_CANDS" --budget-minutes "$TUNE_MINUTES" 2>&1 | tail -80 \
    | tee "$OUT/tune.txt" | tail -12 | tee -a "$LOG"
  step "export"
  python3 -m kdispatch.cli export --device nvidia-h200 -o "$OUT/nvidia-h200.json" 2>&1 | tee -a "$LOG"
  python3 - "$KDISPATCH_DB" "$OUT/h200.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1])
src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
dst = sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.close()
PY
fi

if has bench; then
  [ -f "$OUT/nvidia-h200.json" ] && cp "$OUT/nvidia-h200.json" db/nvidia-h200.json
  step "host cost"; timeout 120 python3 tools/bench_host.py --out "$OUT/host.json" 2>&1 | tail -22 | tee -a "$LOG"
  step "kv_write bench"; timeout 150 python3 tools/bench_kv_write.py --out "$OUT/kv_write.json" 2>&1 \
    | tail -24 | tee -a "$LOG"
  step "decode bench"; timeout 240 python3 tools/bench_decode.py --max-cands 3 --time-limit 200 \
    --out "$OUT/decode.json" 2>&1 | tail -40 | tee -a "$LOG"
  step "report"; python3 tools/report_tuning.py --db "$KDISPATCH_DB" --ceilings "$STATE/ceilings.json" \
    --min-run "$(cat "$STATE/first_run" 2>/dev/null || echo 0)" --json "$OUT/tuning.json" \
    --md "$OUT/tuning.md" 2>&1 | tail -5 | tee -a "$LOG"
  step "example ops on the H200"
  # the package is not installed here (no entry points): import it, then run the CLI
  EXDB="$STATE/example.sqlite"
  excli() { python3 -c "import sys, kdispatch_example_ops; from kdispatch.cli import main; main(sys.argv[1:], prog_name='kdispatch')" "$@"; }
  excli tune --device cuda:0 --op example.rmsnorm,example.softmax --db "$EXDB" 2>&1 | tail -3 | tee -a "$LOG"
  excli export --device nvidia-h200 --op example.rmsnorm,example.softmax \
    -o "$OUT/example-nvidia-h200.json" --db "$EXDB" 2>&1 | tee -a "$LOG"
fi
ls -la "$OUT" | tee -a "$LOG"
step "done"
