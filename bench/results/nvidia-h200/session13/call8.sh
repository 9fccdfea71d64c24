#!/usr/bin/env bash
# Session 13, call 8 (one H200): the adaptive key warm-up (replay until steady, cap 200 ms):
# the tuner's GPU test; llama3-8b decode keys at 6 candidates per key into a fresh database
# with the default warm-up ("default"; call 7 patched it to 0 and 200 ms), the heuristic
# against its pdl twin at every key; then bench_tune.sh ahead-6 (empty Triton cache).
#   OUT=$OUT bash bench/results/nvidia-h200/session13/call8.sh      # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache
echo "== $(date +%T) tuner GPU test"
timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/gpu/test_tune_gpu.py 2>&1 | tail -2
for w in default; do
  echo "== $(date +%T) KEY_WARMUP_MS=$w"
  timeout 120 python3 -m kdispatch.cli tune --device cuda:0 --preset llama3-8b --max-candidates 6 --op decode_attention --db /tmp/w$w.sqlite 2>&1 | tail -3
  python3 - /tmp/w$w.sqlite <<'PY' | tee $OUT/call8-w$w.txt
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
echo "== $(date +%T) ahead-6"
OUT=/tmp/c8tune timeout 100 bash tools/bench_tune.sh ahead-6 2>&1 | grep -E "ahead_s|target" ; cp /tmp/c8tune/bench_tune-ahead-6.md $OUT/call8-ahead-6.md; tail -5 /tmp/c8tune/ahead-6.log > $OUT/call8-ahead-6-log.txt
echo "== $(date +%T) done"
