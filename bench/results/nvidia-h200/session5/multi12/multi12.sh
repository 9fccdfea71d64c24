set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/multi.log
nvidia-smi -L | tee -a $L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $L
run() {  # label devices
  export TRITON_CACHE_DIR=$(mktemp -d)   # every run compiles from scratch
  s=$(date +%s.%N)
  timeout 170 python3 -m kdispatch.cli tune --device $2 --preset llama3-8b --max-candidates 12 --db $OUT/$1.sqlite > $OUT/$1.txt 2>&1
  rc=$?
  e=$(date +%s.%N)
  echo "$1 devices=$2 rc=$rc wall_s=$(python3 -c "print(round($e-$s,1))")" | tee -a $L
  tail -3 $OUT/$1.txt | tee -a $L
  python3 -m kdispatch.cli export --device nvidia-h200 -o $OUT/$1.json --db $OUT/$1.sqlite 2>&1 | tee -a $L
}
run one cuda:0
run two all

python3 - $OUT <<'PY' | tee -a $L
import json, sys
out = sys.argv[1]
t = {n: json.load(open(f"{out}/{n}.json")) for n in ("one", "two")}
keys = {n: sorted(json.dumps(e["key"], sort_keys=True) + e["op"] for e in v["entries"]) for n, v in t.items()}
print("entries", {n: len(k) for n, k in keys.items()}, "same keys one/two:", keys["one"] == keys["two"])
PY
rm -f $OUT/*.sqlite-* ; ls -la $OUT
