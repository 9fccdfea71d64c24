"""Compile the Gluon MLA stage 1 (kdispatch/kernels/decode_attention/gluon_mla.py) for sm_90a
on a machine without a GPU and report ptxas's registers and spills and the shared memory::

    PYTHONPATH=. python tools/gluon_mla_compile.py [--splits 1,2] [--rows 128x1,16x2]
        [--page 16,32,64] [--balance] [--kv bf16,fp8] [--narrow] [--dump DIR]

``--balance`` compiles the balanced grid's variant (twice the splits in the grid: every
program scans the batch's lengths); ``--plan`` the work plan's (each program reads its
item's request and token range); ``--kv fp8`` the fp8 (e4m3) latent's variant, with its
scale tensors; ``--narrow`` the narrow fp8 tile (``gluon_mla_narrow``, through the launch
plan of its config; fp8, up to 16 rows; no spill allowed). Prints one JSON line per (cache dtype, page size, heads x QLEN, split
count); exits 1 when a compile fails, the two warpgroups' code spills (the seesaw's, bf16
latents: more than ``SEESAW_SPILL_LIMIT`` bytes), the copy warp's spills more
than ``COPY_WARP_SPILL_LIMIT`` bytes, or the kernel needs more than the 227 KB of shared
memory an sm_90 block may have. Run without TRITON_INTERPRET.

The kernel is warp-specialized: ptxas reports one spill figure for the whole kernel, so
the disassembly (nvdisasm) attributes each spill store to the register limit in force where
it lies (the last ``USETMAXREG`` before it: the copy warp runs at its 32 registers, the
warpgroups at theirs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
# (compile_check clears TRITON_INTERPRET: the kernel must be a JIT function to compile)
from compile_check import compile_launch, disassemble, ptxas_log, ptxas_usage  # noqa: E402

from kdispatch.kernels.decode_attention import gluon_mla as G  # noqa: E402
from kdispatch.kernels.decode_attention import launch as L  # noqa: E402
from kdispatch.kernels.decode_attention import spec  # noqa: E402
from kdispatch.launching import KernelLaunch  # noqa: E402

SMEM_LIMIT = 227 * 1024
#: spill bytes allowed in the copy warp's code of the form with both warpgroups on each
#: tile (fp8 latents; one warp at 32 registers, waiting on mbarriers: its 16-token-page
#: loop spilled 32 B when bf16 took it; the two warpgroups never)
COPY_WARP_SPILL_LIMIT = 32
#: spill bytes allowed in the seesaw (bf16 latents at every page size, two 4-warp
#: warpgroups at 240 registers): the warpgroups store values they hold across the pair
#: loop (the split's bounds, row offsets, ...) once before it and reload them in it
#: (124-144 B, session 23; 80-108 B with the parts released early); the MMA descriptors
#: are formed in the loop, not spilled
SEESAW_SPILL_LIMIT = 160


def compile_stage1(splits: int, arch: int = 90, heads: int = 128, qlen: int = 1,
                   page: int = 64, balance: bool = False, kv: str = "bf16",
                   plan: bool = False, narrow: bool = False):
    """The stage 1 compiled for ``sm_<arch>`` on small CPU tensors (sizes only reach the
    grid and the integer specializations; the descriptors' block shapes, the dtypes and
    the alignment are what count). ``qlen`` > 1: a 4-D q; ``page``: the cache's page size;
    ``balance``: a grid of twice the splits; ``kv``: ``"bf16"`` or ``"fp8"`` (scaled);
    ``plan``: the work plan's variant (items in the grid's second axis); ``narrow``: the
    narrow fp8 tile (``gluon_mla_narrow``) as the launch path plans it."""
    g = 2 * splits if balance else splits
    b, h = 2, heads
    shape = (b, h) if qlen == 1 else (b, qlen, h)
    q = torch.empty(*shape, G.DV + G.DPE, dtype=torch.bfloat16)
    fp8 = kv == "fp8"
    kv = torch.empty(9, page, 1, G.DV + G.DPE,
                     dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16)
    scale = torch.ones(1) if fp8 else None
    bt = torch.empty(b, 4, dtype=torch.int32)
    sl = torch.empty(b, dtype=torch.int32)
    r = qlen * h
    ws = torch.empty(b * r * g * (G.DV + 1))
    po = ws[:b * r * g * G.DV].view(b, r, g, G.DV)
    pl = ws[b * r * g * G.DV:].view(b, r, g)
    if narrow:
        cfg = spec.narrow_config(splits, r)
        p = L.plan(cfg, b, h, G.DV + G.DPE, page, 1, G.DV, True, False, False, False, qlen,
                   qlen > 1, kv_fp8=True, scaled=True, gluon=True)
        p = dataclasses.replace(p, grid=(1, b, g), constexprs={**p.constexprs,
                                                              "GRID_SPLITS": g})
        return compile_launch(L.launches(p, q, kv, kv[..., :G.DV], bt, sl, q.new_empty(
            p.out_shape), 0.1, 0.0, 0, scale, scale)[0], arch)
    wp = torch.empty(64, dtype=torch.int32) if plan else None
    grid, args, kw = G.stage1_launch_args(q, kv, bt, sl, 0.1, splits, po, pl, g, scale,
                                          scale, wp, wp[:16] if plan else None)
    return compile_launch(KernelLaunch(G._gluon_mla_stage1, grid, args, kw,
                                       G.launch_options(fp8)), arch)


def wgmma_serialized(log: str) -> bool:
    """Whether ptxas's log says it serialized the warpgroup MMAs, for whatever reason (C7514:
    a non-wgmma instruction reads an in-flight accumulator; C7515: one defines it; ...)."""
    return "wgmma.mma_async instructions are serialized" in " ".join(log.split())


#: a ``USETMAXREG`` instruction of a disassembly and the register limit it sets (hex)
SETMAXREG = re.compile(r"USETMAXREG\.\S+ (?:UP\d+, )?0x([0-9a-f]+)")


def register_limits(sass: str) -> list[int]:
    """The register limits the disassembly's ``USETMAXREG`` instructions set, sorted."""
    return sorted({int(m, 16) for m in SETMAXREG.findall(sass)})


def spill_stores_by_limit(sass: str, launch_limit: int) -> dict[int, int]:
    """Spill stores (``STL``) of a disassembly by the register limit in force where each
    lies: the last ``USETMAXREG`` before it, else ``launch_limit``."""
    limit, out = launch_limit, {}
    for line in sass.splitlines():
        m = SETMAXREG.search(line)
        if m:
            limit = int(m.group(1), 16)
        elif re.search(r"\bSTL(\.\S+)? \[", line):
            out[limit] = out.get(limit, 0) + 1
    return out


def ptxas_report(kernel, arch: int = 90) -> dict:
    log = ptxas_log(kernel, arch)
    regs, spill = ptxas_usage(kernel, arch, log)
    sass = disassemble(kernel)
    by_limit = spill_stores_by_limit(sass, G.MAXNREG)
    return {"regs": regs, "spill_store_bytes": spill, "shared_bytes": kernel.metadata.shared,
            "serialized_wgmma_warning": wgmma_serialized(log),
            "wgmma": kernel.asm["ptx"].count("wgmma.mma_async"),
            "bar_sync": kernel.asm["ptx"].count("bar.sync"),
            # spill stores in code run at more registers than the copy warp's
            "warpgroup_spill_stores": sum(n for lim, n in by_limit.items()
                                          if lim > G.COPY_WARP_REGS),
            "register_limits": register_limits(sass)}


def failed(rep: dict) -> bool:
    """Whether a report breaks the tool's bounds (see the module docstring)."""
    if rep.get("narrow"):  # one warpgroup, no warp specialization: no spill at all
        spills = rep["spill_store_bytes"] > 0
    elif G.seesaw(rep["kv"] == "fp8"):
        spills = rep["spill_store_bytes"] > SEESAW_SPILL_LIMIT
    else:
        spills = (rep["warpgroup_spill_stores"] > 0
                  or rep["spill_store_bytes"] > COPY_WARP_SPILL_LIMIT)
    return bool(rep["regs"] is None or spills or rep["shared_bytes"] > SMEM_LIMIT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", default="1,2")
    ap.add_argument("--rows", default="128x1", help="HEADSxQLEN list, e.g. 128x1,16x2")
    ap.add_argument("--page", default="64", help="cache page sizes, e.g. 16,32,64")
    ap.add_argument("--balance", action="store_true", help="the balanced grid's variant")
    ap.add_argument("--plan", action="store_true", help="the work plan's variant")
    ap.add_argument("--kv", default="bf16", help="cache dtypes: bf16, fp8 or bf16,fp8")
    ap.add_argument("--narrow", action="store_true",
                    help="the narrow fp8 tile (gluon_mla_narrow; fp8 only, up to 16 rows)")
    ap.add_argument("--dump", default=None, help="write the ttgir and ptx here")
    args = ap.parse_args()
    bad = 0
    shapes = [tuple(int(v) for v in x.split("x")) for x in args.rows.split(",")]
    pages = [int(x) for x in args.page.split(",")]
    for kv, pg, (h, t), s in ((kv, pg, hq, int(x)) for kv in args.kv.split(",")
                              for pg in pages for hq in shapes
                              for x in args.splits.split(",")):
        tag = {"kv": kv, "page": pg, "heads": h, "qlen": t, "splits": s,
               "balance": args.balance, "plan": args.plan, "narrow": args.narrow}
        try:
            k = compile_stage1(s, heads=h, qlen=t, page=pg, balance=args.balance, kv=kv,
                               plan=args.plan, narrow=args.narrow)
        except Exception as exc:  # noqa: BLE001 - report, exit 1
            print(json.dumps({**tag, "error": str(exc)[:4000]}))
            bad += 1
            continue
        rep = {**tag, **ptxas_report(k)}
        print(json.dumps(rep), flush=True)
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            stem = f"stage1_{kv}_p{pg}_h{h}q{t}_s{s}"
            (Path(args.dump) / f"{stem}.ttgir").write_text(k.asm["ttgir"])
            (Path(args.dump) / f"{stem}.ptx").write_text(k.asm["ptx"])
        bad += failed(rep)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
