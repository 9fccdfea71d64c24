#!/usr/bin/env bash
# Session 12, call 1 (one H200): the head-dim presets' full valid space (issue 18's GQA head
# dims 64 and 256; 96 and 128 are in session 11's database), their report against the read
# ceiling of this run, and the host cost with torch's no-op op floor.
#   OUT=$OUT bash bench/results/nvidia-h200/session12/call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
export KDISPATCH_DB=/tmp/hd.sqlite
step() { echo "== $(date +%T) $*"; }
step ceilings; python3 tools/ceilings.py --out "$OUT/ceilings.json" 2>&1 | tail -2
step "tune llama3.2-1b,gemma2-9b (every valid candidate)"
python3 -m kdispatch.cli tune --device cuda:0 --preset llama3.2-1b,gemma2-9b \
  --max-candidates all --budget-minutes ${TUNE_MINUTES:-4} 2>&1 | tail -8
python3 - "$KDISPATCH_DB" "$OUT/hd.sqlite" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()
PY
step report; python3 tools/report_tuning.py --db "$KDISPATCH_DB" --ceilings "$OUT/ceilings.json" \
  --md "$OUT/tuning-hd.md" 2>&1 | tail -3
step host; timeout 150 python3 tools/bench_host.py --out "$OUT/host.json" 2>&1 | tail -24
step done
