"""The split-merge (reduce) kernel alone: launch shapes timed back to back in one CUDA graph.

The MLA b32 x 16k timeline (``mla_timeline.py``) showed the reduce adding ~10 us per call
between two stage-1 launches (8 MB of partials). This times ``_decode_reduce`` alone over
random partials for a grid of (BLOCK_DV, SPLIT_CHUNK, num_warps), against an empty kernel
(the graph's launch floor), and checks each result against the default launch's.

    python tools/experiments/reduce_sweep.py --out $OUT/reduce_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kdispatch.kernels.decode_attention import _decode_reduce, _p2  # noqa: E402


@triton.jit
def _empty(X):
    pass


# (name, batch, q heads, dv, splits, block_n, context)
SHAPES = [("mla-b32-s8", 32, 16, 512, 8, 32, 16384), ("mla-b8-s33", 8, 12, 512, 33, 32, 327600),
          ("mla-b8-s32", 8, 16, 512, 32, 32, 16384), ("mla128-b32-s2", 32, 128, 512, 2, 64, 16384),
          ("gqa-b8-s4", 8, 32, 128, 4, 64, 32768), ("mla-b1-s132", 1, 12, 512, 132, 32, 65536)]
VARIANTS = [(128, 16, 4), (128, 8, 4), (64, 16, 2), (64, 8, 2), (256, 16, 4), (256, 8, 4),
            (512, 8, 4), (512, 16, 8), (128, 8, 1), (64, 8, 1), (32, 8, 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="reduce_sweep.json")
    args = ap.parse_args()
    res = {"torch": torch.__version__, "triton": triton.__version__, "rows": []}
    reps, per_graph = 20, 16
    for name, b, hq, dv, splits, bn, ctx in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(1)
        po = torch.randn((b, hq, splits, dv), generator=g, device="cuda")
        pl = torch.randn((b, hq, splits), generator=g, device="cuda") * 4
        sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
        sl[-1] = ctx - 37
        max_len = ctx + 64
        outs = {}

        def launch(v, out):
            if v == "empty":
                _empty[(hq, 1, b)](out)
                return
            bdv, chunk, warps = v
            bdv = min(bdv, _p2(dv))
            _decode_reduce[(hq, triton.cdiv(dv, bdv), b)](
                sl, po, pl, out, 0, max_len, sl.stride(0), po.stride(0), po.stride(1),
                po.stride(2), pl.stride(0), pl.stride(1), out.stride(0), out.stride(1),
                DV=dv, BLOCK_DV=bdv, BLOCK_N=bn, NUM_KV_SPLITS=splits,
                SPLITS_P2=max(16, _p2(splits)), SPLIT_CHUNK=chunk, SLIDING=False,
                USE_PDL=False, num_warps=warps, num_stages=2)

        for v in ["empty", *VARIANTS]:
            out = torch.empty((b, hq, dv), dtype=torch.bfloat16, device="cuda")
            launch(v, out)
            torch.cuda.synchronize()
            if v != "empty":
                outs[v] = out.float().clone()
            graph = torch.cuda.CUDAGraph()
            st = torch.cuda.Stream()
            with torch.cuda.stream(st), torch.cuda.graph(graph, stream=st):
                for _ in range(per_graph):
                    launch(v, out)
            for _ in range(3):
                graph.replay()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(reps):
                e0.record()
                graph.replay()
                e1.record()
                torch.cuda.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3 / per_graph)
            us = sorted(times)[reps // 2]
            ok = v == "empty" or torch.allclose(outs[v], outs[VARIANTS[0]], atol=1e-2,
                                                rtol=1e-2)
            res["rows"].append({"shape": name, "variant": v, "us": us, "ok": bool(ok)})
            print(f"{name:14s} {str(v):14s} {us:6.2f} us {'ok' if ok else 'WRONG'}", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
