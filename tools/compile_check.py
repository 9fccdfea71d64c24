"""Compile the decode / KV-write kernels for a GPU architecture on a machine without a GPU.

Triton compiles ahead of time for a named target (its wheel carries ptxas), so the lowering
of every kernel variant -- fp8 conversions, multi-token rows, each tile -- can be checked
on the CPU, with ptxas's register and spill counts for each: what the latent tile table
(``LATENT_TILES`` in kdispatch/kernels/decode_attention/spec.py) was chosen from where no
GPU time had measured it. Arguments are specialized the way Triton's JIT does (16-byte
alignment, divisibility by 16, integers equal to 1 as constants). Timing still needs the
GPU: spills and registers only say what cannot be fast.

    python tools/compile_check.py                       # heuristic configs of the presets
    python tools/compile_check.py --preset kimi-k3-tp8 --candidates 6 --arch 90

Exits 1 when a kernel fails to compile. Run without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the kernels must be JIT functions, not interpreted
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from kdispatch.device import Device  # noqa: E402
from kdispatch.dtypes import torch_dtype  # noqa: E402
from kdispatch.kernels.decode_attention import OP as DECODE  # noqa: E402
from kdispatch.kernels.decode_attention import launch as decode_launch  # noqa: E402
from kdispatch.kernels.kv_write import OP as WRITE  # noqa: E402
from kdispatch.kernels.kv_write import launch as write_launch  # noqa: E402
from kdispatch.registry import all_ops  # noqa: E402
from kdispatch.tuning.presets import expand  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compile_launch(launch, arch: int):
    """Compile one :class:`~kdispatch.launching.KernelLaunch` for ``sm_<arch>`` (a Gluon
    kernel from its Gluon source; its ``num_warps`` is a parameter as well as an option)."""
    given = {**launch.constexprs, **launch.options}
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(launch.fn.arg_names):
        if name in given:
            sig[name], consts[name] = "constexpr", given[name]
            continue
        ty, attr = native_specialize_impl(BaseBackend, launch.args[i], False, True, True)
        sig[name] = ty
        if ty == "constexpr":
            consts[name] = attr
        elif isinstance(attr, str):
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    opts = {k: v for k, v in launch.options.items()
            if k in ("num_warps", "num_stages", "maxnreg")}
    source = GluonASTSource if type(launch.fn).__name__ == "GluonJITFunction" else ASTSource
    return triton.compile(source(launch.fn, sig, consts, attrs),
                          target=GPUTarget("cuda", arch, 32), options=opts)


def ptxas_log(kernel, arch: int) -> str:
    """What ``ptxas -v`` says (its stderr) when it assembles the kernel's PTX."""
    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(kernel.asm["ptx"])
        res = subprocess.run([str(BIN / "ptxas"), "-v", f"-arch=sm_{arch}a", str(ptx), "-o",
                              str(Path(d) / "k.cubin")], capture_output=True, text=True)
    return res.stderr


def ptxas_usage(kernel, arch: int, log: str | None = None) -> tuple[int | None, int | None]:
    """(registers per thread, spill-store bytes) that ptxas reports for the kernel (from
    ``log`` when it was already run)."""
    log = ptxas_log(kernel, arch) if log is None else log
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return (int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else None)


def disassemble(kernel, tool: str = "nvdisasm") -> str:
    """The kernel's SASS from its cubin: ``nvdisasm -c`` (labelled branches) or
    ``cuobjdump -sass`` (branches to addresses)."""
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        flag = "-c" if tool == "nvdisasm" else "-sass"
        return subprocess.run([str(BIN / tool), flag, str(cubin)], capture_output=True,
                              text=True, check=True).stdout


def decode_launches(key, config):
    """The decode launches of ``config`` on small CPU tensors of ``key``'s dtypes and strides
    (what the compiled code depends on; the sizes that only reach the grid are cut, but the
    block table is as wide as the key's context, so a split config compiles the balanced
    grid's variant a batch gets)."""
    b, page = 2, key.page_size
    pages = -(-key.context // page)
    nb = 9
    q_shape = (b, key.q_len, key.num_q_heads, key.head_dim) if key.q_len > 1 else (
        b, key.num_q_heads, key.head_dim)
    q = torch.empty(q_shape, dtype=torch_dtype(key.dtype))
    kd = torch_dtype(key.kv_dtype)
    k = torch.empty(nb, page, key.num_kv_heads, key.head_dim, dtype=kd)
    v = k[..., :key.head_dim_v] if key.latent else torch.empty(
        nb, page, key.num_kv_heads, key.head_dim_v, dtype=kd)
    bt = torch.empty(b, pages, dtype=torch.int32)
    sl = torch.empty(b, dtype=torch.int32)
    scale = torch.ones(1) if kd != q.dtype else None
    window = 64 if key.sliding else None
    p = decode_launch.checked_plan(config, q, k, v, bt, sl, window, 0.0, scale)
    return decode_launch.launches(p, q, k, v, bt, sl, q.new_empty(p.out_shape), 0.1, 0.0,
                                  int(window or 0), scale, scale)


def write_launches(key, config):
    t, page, nb = min(key.tokens, 8), key.page_size, 4
    x = torch.empty(t, key.num_kv_heads, key.head_dim, dtype=torch_dtype(key.dtype))
    cache = torch.empty(nb, page, key.num_kv_heads, key.head_dim,
                        dtype=torch_dtype(key.kv_dtype))
    scale = torch.ones(1) if cache.dtype != x.dtype else None
    slots = torch.empty(t, dtype=torch.int64)
    return write_launch.launches(config, x, x, cache, cache, slots, None, None, scale,
                                 scale)[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="kimi-k3-tp8,deepseek-v3-tp8,llama3-8b,ouro-1.4b")
    ap.add_argument("--device", default="nvidia-h200", help="device key of the configs")
    ap.add_argument("--arch", type=int, default=90, help="sm_<arch> to compile for")
    ap.add_argument("--candidates", type=int, default=0, help="also the first N candidates")
    args = ap.parse_args()
    dev = Device.from_key(args.device)
    failed = 0
    seen = set()
    for entry in expand(args.preset.split(","), all_ops()):
        op = DECODE if entry.op == DECODE.name else WRITE
        if entry.op not in (DECODE.name, WRITE.name):
            continue
        key = op.key(dev, {"device": dev.key, **entry.args})
        configs = [op.heuristic(key)]
        configs += [c for c in list(op.tuning.candidates(key))[:args.candidates]
                    if c not in configs]
        for cfg in configs:
            if (key, cfg) in seen or getattr(cfg, "variant", "fused") != "fused":
                continue
            seen.add((key, cfg))
            make = decode_launches if op is DECODE else write_launches
            cfg = cfg.model_copy(update={"pdl": False})  # launch_pdl is a launch option
            shape = {k: v for k, v in key.model_dump().items()
                     if k not in ("device", "vendor", "arch", "cu_count")}
            cells = []
            for launch in make(key, cfg):
                t0 = time.time()
                try:
                    kern = compile_launch(launch, args.arch)
                except Exception as exc:  # noqa: BLE001 - report every failure, then exit 1
                    failed += 1
                    cells.append(f"{launch.fn.__name__}: FAILED {str(exc).splitlines()[0]}")
                    continue
                regs, spill = ptxas_usage(kern, args.arch)
                cells.append(f"{launch.fn.__name__} regs {regs} spill {spill} smem "
                             f"{kern.metadata.shared} ({time.time() - t0:.0f}s)")
            print(f"{op.name} {shape}\n  {cfg.model_dump()}\n  " + " | ".join(cells),
                  flush=True)
    print(f"{len(seen)} configs, {failed} failed compiles")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
