#!/usr/bin/env bash
# The hand-written MLA decode kernel (FlashMLA's Hopper dense decode) as a same-run peer for
# tools/bench_flashmla.py. Its source never enters the repository: it is packed into the
# git-ignored .peers/ folder here and built there, on the device.
#
#   tools/flashmla_peer.sh pack FLASHMLA_GIT CUTLASS_GIT   # here: -> .peers/flashmla.tar.xz
#   tools/flashmla_peer.sh build                          # device: -> .peers/flashmla/*.so
#
# FLASHMLA_GIT and CUTLASS_GIT are git directories (bare mirrors do); the CUTLASS commit is
# the one FlashMLA's submodule pins. Only the dense decode sources are built (sm_90a, bf16):
# the schedule-metadata kernel, the split kernel and the combine, behind a one-function
# binding (dense_decode_fwd, FlashMLA's own dense_attn_decode_interface).
# Example (a device call, carrying .peers/flashmla.tar.xz):
#   tools/flashmla_peer.sh build && python3 tools/bench_flashmla.py --out $OUT/flashmla.json
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEERS="$ROOT/.peers"
cmd="${1:-}"

case "$cmd" in
pack)
    fm="${2:?pack: give the FlashMLA git directory}"
    cl="${3:?pack: give the CUTLASS git directory}"
    pin="$(git --git-dir="$fm" ls-tree HEAD csrc/cutlass | awk '{print $3}')"
    [ -n "$pin" ] || { echo "pack: $fm pins no csrc/cutlass commit" >&2; exit 1; }
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/flashmla"
    git --git-dir="$fm" archive HEAD csrc | tar -x -C "$tmp/flashmla"
    git --git-dir="$cl" archive --prefix=csrc/cutlass/ "$pin" include tools/util/include \
        | tar -x -C "$tmp/flashmla"
    echo "flashmla $(git --git-dir="$fm" rev-parse HEAD) cutlass $pin" > "$tmp/flashmla/REVISION"
    cat > "$tmp/flashmla/csrc/api/dense_only.cpp" <<'EOF'
// The dense decode entry point alone (the full api.cpp also binds sparse and sm100 kernels).
#include <pybind11/pybind11.h>
#include "dense_decode.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("dense_decode_fwd", &dense_attn_decode_interface);
}
EOF
    mkdir -p "$PEERS"
    tar -C "$tmp" -cJf "$PEERS/flashmla.tar.xz" flashmla
    ls -l "$PEERS/flashmla.tar.xz"
    ;;
build)
    [ -f "$PEERS/flashmla.tar.xz" ] || { echo "build: $PEERS/flashmla.tar.xz is missing (run pack here and carry it)" >&2; exit 1; }
    rm -rf "$PEERS/flashmla"
    tar -C "$PEERS" -xJf "$PEERS/flashmla.tar.xz"
    cd "$PEERS/flashmla"
    TORCH_CUDA_ARCH_LIST="9.0a" MAX_JOBS="${MAX_JOBS:-8}" python3 - <<'EOF'
import os
from torch.utils.cpp_extension import CUDA_HOME, load
c = os.path.join(os.getcwd(), "csrc")
cccl = os.path.join(CUDA_HOME, "include", "cccl")  # CUDA 13 keeps cuda/std here (nvcc finds
                                                    # it by itself, the host compiler does not)
os.makedirs("build", exist_ok=True)
load(name="flash_mla_dense", build_directory="build", verbose=False,
     sources=[f"{c}/api/dense_only.cpp",
              f"{c}/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
              f"{c}/smxx/decode/combine/combine.cu",
              f"{c}/sm90/decode/dense/instantiations/bf16.cu"],
     extra_include_paths=[c, f"{c}/api", f"{c}/kerutils/include", f"{c}/sm90",
                          f"{c}/cutlass/include", f"{c}/cutlass/tools/util/include"]
                        + ([cccl] if os.path.isdir(cccl) else []),
     extra_cflags=["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations",
                   "-DFLASH_MLA_DISABLE_FP16"],
     extra_cuda_cflags=["-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES",
                        "-Wno-deprecated-declarations", "-U__CUDA_NO_HALF_OPERATORS__",
                        "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
                        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr",
                        "--expt-extended-lambda", "--use_fast_math",
                        "-DFLASH_MLA_DISABLE_FP16",
                        "-gencode", "arch=compute_90a,code=sm_90a"])
print("built", [f for f in os.listdir("build") if f.endswith(".so")])
EOF
    ;;
*)
    echo "usage: tools/flashmla_peer.sh pack FLASHMLA_GIT CUTLASS_GIT | build" >&2
    exit 2
    ;;
esac
