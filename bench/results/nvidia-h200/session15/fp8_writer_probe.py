"""Where the fp8 writer's extra time goes (issue 17: the 96-write graph of one-token writes
within 10% of the bf16 writer; it runs ~1.29x). A probe, not the shipped kernel: variants of
the fused writer's fp8 path, each checked bit for bit against kdispatch's writer on the same
inputs, then timed as 96 one-token writes (16 kv heads x 128, Ouro's decode shape) in one
CUDA graph, beside kdispatch's bf16 and fp8 writers in the same run.

Variants (a program writes BLOCK_H heads of one token; 4 warps):
- ``joint``: K and V in every program, as kdispatch does (the reference for the probe);
- ``split``: a third grid axis picks K or V, so a program runs one reciprocal and one
  quantization chain instead of two in sequence;
- ``noclamp``: no explicit clamp before the cast (sm_90's cvt.rn.satfinite saturates to
  +-448 and keeps NaN: the same bytes);
- ``split+noclamp``;
and, for timing only (not the same bytes, so not bit-checked), what the quantization's parts
cost: ``castonly`` (no scale: the cast alone), ``mulonly`` (the loaded scale multiplied in,
no reciprocal), ``nofallback`` (the reciprocal as a plain fp32 division and the corrected
product, without the exact division's fallback branch and its out-of-line slow path).

    PYTHONPATH=$PWD python3 bench/results/nvidia-h200/session15/fp8_writer_probe.py \
        --out $OUT/fp8-writer-probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from kdispatch.kernels.kv_write import KVWriteConfig, launch_kv_write
from kdispatch.kernels.kv_write.kernel import _div_by

FP8 = torch.float8_e4m3fn


@triton.jit
def _q(x, scale_ptr, CLAMP: tl.constexpr, MODE: tl.constexpr):
    y = x.to(tl.float32)
    if MODE == 1:  # mulonly
        y = y * tl.load(scale_ptr)
    elif MODE == 2:  # nofallback
        scale = tl.load(scale_ptr)
        y = _div_by(y, scale, 1.0 / scale)
    elif MODE == 0:  # exact (kdispatch's)
        scale = tl.load(scale_ptr)
        inv = tl.math.div_rn(1.0, scale)
        if (tl.abs(scale) >= 2.350988701644575e-38) & (tl.abs(scale) <= 4.253529586511731e+37):
            y = _div_by(y, scale, inv)
        else:
            y = tl.math.div_rn(y, scale)
    if CLAMP:
        y = tl.clamp(y, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    return y.to(tl.float8e4nv, fp_downcast_rounding="rtne")


@triton.jit
def _probe(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, num_slots,
           stride_kt, stride_kh, stride_vt, stride_vh, stride_kcb, stride_kcp, stride_kch,
           stride_vcb, stride_vcp, stride_vch,
           NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
           BLOCK_H: tl.constexpr, SPLIT: tl.constexpr, CLAMP: tl.constexpr,
           MODE: tl.constexpr):
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    slot = tl.load(slot_ptr).to(tl.int64)
    ok = (slot >= 0) & (slot < num_slots)
    slot = tl.where(ok, slot, 0)
    blk = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    do_k = True
    do_v = True
    if SPLIT:
        do_k = tl.program_id(2) == 0
        do_v = tl.program_id(2) == 1
    if do_k:
        k = tl.load(k_ptr + (h * stride_kh)[:, None] + d[None, :])
        tl.store(kc_ptr + (blk * stride_kcb + off * stride_kcp + h * stride_kch)[:, None]
                 + d[None, :], _q(k, ks_ptr, CLAMP, MODE), mask=ok)
    if do_v:
        v = tl.load(v_ptr + (h * stride_vh)[:, None] + d[None, :])
        tl.store(vc_ptr + (blk * stride_vcb + off * stride_vcp + h * stride_vch)[:, None]
                 + d[None, :], _q(v, vs_ptr, CLAMP, MODE), mask=ok)


def probe_write(variant, key, value, kc, vc, slot, ks, vs, block_h):
    split = "split" in variant
    grid = (1, 16 // block_h, 2 if split else 1)
    _probe[grid](key, value, kc, vc, slot, ks, vs, kc.shape[0] * kc.shape[1],
                 key.stride(0), key.stride(1), value.stride(0), value.stride(1),
                 kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1),
                 vc.stride(2), NUM_HEADS=16, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=block_h,
                 SPLIT=split, CLAMP="noclamp" not in variant,
                 MODE=MODES.get(variant.split("+")[-1], 0), num_warps=4, launch_pdl=True)


#: timing-only modes of the quantization (see the module docstring); 3: the cast alone
MODES = {"mulonly": 1, "nofallback": 2, "castonly": 3}


def steps(n, dtype, gen):
    out = []
    for i in range(n):
        qkv = (torch.rand(1, 3 * 16 * 128, generator=gen) * 2 - 1).to("cuda", torch.bfloat16)
        qkv[0, 2048:2112] = 9.0  # K and V values beyond 448 x their scale:
        qkv[0, 4096:4160] = -19.0  # they saturate
        key = qkv[:, 2048:4096].view(1, 16, 128)
        value = qkv[:, 4096:].view(1, 16, 128)
        kc = torch.zeros(368, 16, 16, 128, device="cuda", dtype=dtype)
        vc = torch.zeros_like(kc)
        slot = torch.tensor([int(torch.randint(0, 368 * 16, (1,), generator=gen))],
                            device="cuda")
        ks = torch.full((1,), 0.0117 + 1e-4 * i, device="cuda")
        vs = torch.full((1,), 0.0231 + 1e-4 * i, device="cuda")
        out.append((key, value, kc, vc, slot, ks, vs))
    return out


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    for _ in range(20):
        g.replay()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / 96)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fp8-writer-probe.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    fp8 = steps(96, FP8, gen)
    bf = [(k, v, kc.to(torch.bfloat16), vc.to(torch.bfloat16), s, None, None)
          for k, v, kc, vc, s, _, _ in fp8]
    cfg = KVWriteConfig(variant="fused", block_h=4, block_t=1, num_warps=4, pdl=True)
    variants = ["joint", "split", "noclamp", "split+noclamp"]
    block_hs = (4, 2)
    # bits: every probe variant against kdispatch's writer on the same step
    checks = {}
    for k, v, kc, vc, s, ks, vs in fp8[:8]:
        launch_kv_write(cfg, k, v, kc, vc, s, k_scale=ks, v_scale=vs)
        ref = (kc.view(torch.uint8).clone(), vc.view(torch.uint8).clone())
        for var in variants:
            for bh in block_hs:
                kc.zero_(), vc.zero_()
                probe_write(var, k, v, kc, vc, s, ks, vs, bh)
                same = torch.equal(kc.view(torch.uint8), ref[0]) and torch.equal(
                    vc.view(torch.uint8), ref[1])
                checks[f"{var}/h{bh}"] = checks.get(f"{var}/h{bh}", True) and same
    cases = {"kdispatch bf16": lambda: [launch_kv_write(cfg, k, v, kc, vc, s)
                                        for k, v, kc, vc, s, _, _ in bf],
             "kdispatch fp8": lambda: [launch_kv_write(cfg, k, v, kc, vc, s, k_scale=ks,
                                                       v_scale=vs)
                                       for k, v, kc, vc, s, ks, vs in fp8]}
    for var in variants:
        for bh in block_hs:
            cases[f"probe {var} block_h={bh}"] = (
                lambda var=var, bh=bh: [probe_write(var, *st, bh) for st in fp8])
    for var in ("castonly", "mulonly", "nofallback", "split+castonly", "split+nofallback"):
        cases[f"probe {var} block_h=4 (timing only)"] = (
            lambda var=var: [probe_write(var, *st, 4) for st in fp8])
    res = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            res[name].append(timed(fn, args.reps))
    bf16 = statistics.median(res["kdispatch bf16"])
    table = {name: {"us_per_write": statistics.median(v), "rounds": v,
                    "x_bf16": statistics.median(v) / bf16} for name, v in res.items()}
    json.dump({"bits_equal_kdispatch_fp8": checks, "cases": table}, open(args.out, "w"),
              indent=1)
    print("bits equal to kdispatch's fp8 writer:", checks)
    for name, r in table.items():
        print(f"{name:36s} {r['us_per_write']:7.3f} us/write  {r['x_bf16']:.3f}x bf16")


if __name__ == "__main__":
    main()
