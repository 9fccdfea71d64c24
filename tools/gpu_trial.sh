#!/usr/bin/env bash
# Judge and re-tune a kernel change in one device call on a two-GPU host (nvidia-h200-x2):
#
#   GPU 0: tools/ab_decode.py of this tree against each reference tree in $REFS (same run,
#          heuristic configs, no table), then the KV-write benchmark of this tree and of the
#          first reference (each on its heuristic configs)
#   GPU 1: the GPU tests (a failure skips the tune), then the tune of every preset key
#          resumed on $BASE_DB, and the export of the table
#
# Both halves run at once; everything lands under $OUT (packed into trial.tgz beside
# the tuned h200.sqlite at the end). A kernel change changes the source
# hash, so the tune re-measures the changed op's keys and keeps the others' rows.
#
#   git archive main kdispatch tools | tar -x -C .exp/ref-main          # reference trees,
#   bash bench/results/nvidia-h200/session9/make_noguard.sh main .exp/ref-noguard   # ignored
#   REFS=".exp/ref-main .exp/ref-noguard" BASE_DB=bench/results/nvidia-h200/session9/h200.sqlite \
#     TUNE_MINUTES=6 TEST_SECONDS=120 bash tools/gpu_trial.sh   # carry [".whl", ".exp"]
#
# (the tune searches every candidate of a key up to MAX_CANDS, 60 unless set; the call's
# 10 minutes hold the tests, TUNE_MINUTES of tuning and the export)
#
# CASES overrides the A/B cases (ab_decode's --case syntax). SKIP_REF_KV=1 times the KV
# writes of this tree only; BENCH_SECONDS=N then runs tools/bench_decode.py (N seconds) and
# tools/bench_host.py on GPU 0.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
REFS=${REFS:?REFS: the reference trees, space-separated}
CASES=${CASES:-"llama-b64:64,32,8,128,128,8192 llama-b8:8,32,8,128,128,65536 \
ds-b32:32,16,1,576,512,16384 kimi-b8:8,16,1,576,512,327600 \
kimi-b8-fp8:8,16,1,576,512,327600,fp8 dp128-b32:32,128,1,576,512,16384 \
ds-b32-q2:32,16,1,576,512,16384,q2"}
if ls .whl/*.whl >/dev/null 2>&1; then   # the GPU image lacks pydantic and sqlalchemy
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site
unset TRITON_INTERPRET
mkdir -p /tmp/no-tables
case_args=()
for c in $CASES; do case_args+=(--case "$c"); done

gpu0() {
  export CUDA_VISIBLE_DEVICES=0 KDISPATCH_TABLE_DIR=/tmp/no-tables \
    KDISPATCH_DB=sqlite:////tmp/trial-ab.sqlite
  for ref in $REFS; do
    name=$(basename "$ref")
    echo "== $(date +%T) A/B against $name"
    timeout ${AB_SECONDS:-200} python3 tools/ab_decode.py --ref-path "$ref" --rounds 2 \
      --reps 15 "${case_args[@]}" --config heuristic --out "$OUT/ab-$name.json" 2>&1 | tail -12
  done
  first=${REFS%% *}
  echo "== $(date +%T) KV writes: this tree, then $(basename "$first")"
  timeout 90 python3 tools/bench_kv_write.py --out "$OUT/kv_write-trial.json" 2>&1 | tail -4
  if [ -f "$first/tools/bench_kv_write.py" ] && [ -z "${SKIP_REF_KV:-}" ]; then
    (cd "$first" && timeout 90 python3 tools/bench_kv_write.py \
      --out "$OUT/kv_write-$(basename "$first").json" 2>&1 | tail -4)
  fi
  if [ -n "${BENCH_SECONDS:-}" ]; then  # the decode benchmark and the host cost, this tree
    echo "== $(date +%T) decode benchmark"
    timeout "$BENCH_SECONDS" python3 tools/bench_decode.py --max-cands 3 \
      --time-limit $((BENCH_SECONDS - 30)) --out "$OUT/decode.json" 2>&1 | tail -30
    echo "== $(date +%T) host cost"
    timeout 100 python3 tools/bench_host.py --out "$OUT/host.json" 2>&1 | tail -16
  fi
}

gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  echo "== $(date +%T) GPU tests"
  if timeout ${TEST_SECONDS:-150} env PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q \
      -p no:cacheprovider -p no:warnings -m gpu tests tests/torch tests/test_memory_safety.py \
      --deselect tests/gpu/test_tune_gpu.py > "$OUT/gpu-tests.txt" 2>&1; then
    tail -3 "$OUT/gpu-tests.txt"
    STATE=/tmp/trial-state WHEELS_INSTALLED=1 MAX_CANDS=${MAX_CANDS:-60} \
      bash tools/gpu_session.sh tune 2>&1 | tail -8
  else
    tail -15 "$OUT/gpu-tests.txt"
    echo "== GPU tests failed: no tune"
  fi
}

gpu1 > "$OUT/gpu1.log" 2>&1 &
gpu0 2>&1 | tee "$OUT/gpu0.log"
wait
cat "$OUT/gpu1.log"
# at most 8 files come back from a device call: everything but the database in one archive
(cd "$OUT" && find . -maxdepth 1 -type f ! -name h200.sqlite ! -name trial.tgz -printf '%P\n' \
  | tar czf trial.tgz -T - && find . -maxdepth 1 -type f ! -name h200.sqlite ! -name trial.tgz -delete)
echo "== $(date +%T) done: $(ls "$OUT" | tr '\n' ' ')"
