#!/usr/bin/env bash
# Session 13, call 7 (one H200): the tuner's first-candidate bias (llama bf16 b4 x 262,144:
# the heuristic measured ~14% slower than identical twins, also with the 5 ms key warm-up).
# llama3-8b decode keys at 6 candidates per key, tuned twice into fresh databases with KEY_WARMUP_MS
# patched to 0 and to 200 ms; per run, the heuristic against its pdl twin at every key.
#   OUT=$OUT bash bench/results/nvidia-h200/session13/call7.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
for w in 0 200; do
  echo "== $(date +%T) KEY_WARMUP_MS=$w"
  timeout 120 python3 -c "import sys; import kdispatch.tuning.measure as m; m.KEY_WARMUP_MS=float(sys.argv[1]); sys.argv=['kdispatch']+sys.argv[2:]; from kdispatch.cli import main; main()" \
    $w tune --device cuda:0 --preset llama3-8b --max-candidates 6 --op decode_attention --db /tmp/w$w.sqlite 2>&1 | tail -3
  python3 - /tmp/w$w.sqlite <<'PY' | tee $OUT/call7-w$w.txt
import json, sqlite3, statistics, sys
c = sqlite3.connect(sys.argv[1])
rows = c.execute("select key_json, config_json, median_us, is_heuristic from kd_measurements "
                 "where op='decode_attention' and status='ok'").fetchall()
by = {}
for k, cfg, m, h in rows:
    by.setdefault(k, []).append((json.loads(cfg), m, h))
out = []
for k, v in by.items():
    heur = [x for x in v if x[2]]
    if not heur:
        continue
    twin = dict(heur[0][0]); twin["pdl"] = not twin.get("pdl", False)
    t = [x for x in v if x[0] == twin]
    if t:
        kk = json.loads(k)
        out.append((heur[0][1] / t[0][1], kk["batch"], kk["context"], kk["kv_dtype"], heur[0][1], t[0][1]))
out.sort()
print("keys", len(out), "median heuristic/twin", round(statistics.median(r[0] for r in out), 3))
for r in out[-4:]:
    print("worst", [round(r[0], 3), *r[1:4], round(r[4], 1), round(r[5], 1)])
PY
done
echo "== $(date +%T) done"
