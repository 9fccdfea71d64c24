#!/usr/bin/env bash
# Session 31, call 2 (one H200), on branch narrow-fp8: the narrow tile's e4m3 scores with
# each 128 columns in their own accumulator, summed in fp32 (call 1: one accumulator over
# 576 columns failed at logits of ~160 in log2 units). (1) the precision probe, both score
# forms beside the 64-row tile; (2) narrow_check.py (both forms timed, same run); (3)
# decide_scores.py picks the default from (1) and (2) and, if e4m3, flips F16_QK in this
# tree (the same edit is committed after the call); (4) decode re-tuned on session 29's
# database (its kv_write rows are current), every preset, 8 candidates a key, and exported.
#   OUT=$OUT bash bench/results/nvidia-h200/session31/call2.sh   # carry [".whl"]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export WHEELS_INSTALLED=1
unset TRITON_INTERPRET PYTHONDONTWRITEBYTECODE KDISPATCH_FAST_OPS KDISPATCH_DB
export PYTHONPYCACHEPREFIX=/tmp/kdispatch-pycache PYTHONPATH=/tmp/site:$PWD
F="Warning\|config, outcome\|tuned with other"
D=bench/results/nvidia-h200
echo "== $(date +%T) precision"
timeout 90 python3 $D/session30/narrow_precision.py $OUT/call2-precision.json 2>&1 | grep -v "$F"
echo "== $(date +%T) narrow_check ($SECONDS s in)"
timeout 100 python3 $D/session31/narrow_check.py --out $OUT/call2-narrow.json 2>&1 \
  | grep -v "$F" | grep -v "^check.*stable True" | grep "check\|  " | tail -50
echo "== $(date +%T) decide ($SECONDS s in)"
if python3 $D/session31/decide_scores.py $OUT/call2-precision.json $OUT/call2-narrow.json; then
  sed -i 's/^F16_QK = True$/F16_QK = False/' kdispatch/kernels/decode_attention/gluon_mla_narrow.py
fi
grep -n "^F16_QK" kdispatch/kernels/decode_attention/gluon_mla_narrow.py
python3 -c "from kdispatch.kernels.decode_attention.op import OP; print('decode hash', OP.source_hash())"
echo "== $(date +%T) tune ($SECONDS s in)"
export MAX_CANDS=8 STATE=/tmp/s31-state BASE_DB=$D/session29/h200.sqlite
export PRESETS=deepseek-v3-dp,kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b,huginn,llama3.2-1b,gemma2-9b
TUNE_MINUTES=$(python3 -c "print(round((575 - $SECONDS) / 60 - 0.4, 1))") bash tools/gpu_session.sh tune
mv "$OUT/session.log" "$OUT/call2-session.log"; mv "$OUT/tune.txt" "$OUT/call2-tune.txt"
ls -la $OUT
echo "== $(date +%T) done ($SECONDS s)"
