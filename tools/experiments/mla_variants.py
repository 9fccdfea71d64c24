"""MLA stage-1 variants for split-KV paged decode attention: one device run, compared side by side.

Absorbed MLA only (Hk == 1, Dk 576 = 512 latent + 64 rope, V = the first 512 latent columns,
bf16, 16-token pages). Every variant is its own @triton.jit stage 1, launched by one host
launcher and merged by the library's ``_decode_reduce``; each (variant, config, splits) is
checked against ``reference_decode_attention`` (fp32) on random inputs before it is timed.

Variants
--------
ctrl   the library's stage 1 (SHARED_KV path; GROUP / HEAD_BLOCKS / split count passed as
       unspecialized runtime ints so one compile serves every split count and head count)
evict  ctrl with eviction_policy="evict_first" on the latent loads
half   the 512 latent columns as two 256-column halves: three QK dots, two PV dots into two
       accumulators (smaller operand tiles per dot, less register pressure)
tload  K loaded transposed ([D, N] pointer layout) for the QK dot; V loaded again as [N, D]
       for the PV dot (the second read of the same rows should hit L1/L2)
bh64   ctrl with BLOCK_H 64 (heads padded to 64: Hopper wgmma needs M >= 64 per warpgroup)

Timing: CUDA-graph replays, triton.testing.do_bench(return_mode="median"), rotating input
sets when the working set is under 4x L2; the streaming-read ceiling comes from
tools/bench_decode.py in the same run.

    python tools/experiments/mla_variants.py --out $OUT/mla_variants.json
    TRITON_INTERPRET=1 python tools/experiments/mla_variants.py --smoke   # CPU check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from kdispatch.kernels.decode_attention import _decode_reduce  # noqa: E402
from kdispatch.kernels.decode_attention_ref import reference_decode_attention  # noqa: E402

LOG2E = 1.4426950408889634
L2_BYTES = 60 << 20
# runtime ints that vary with the shape / split count: no value or alignment specialization,
# so one compile per (variant, tile) serves every split count and 12 or 16 heads
_NOSPEC = ["GROUP", "HEAD_BLOCKS", "NUM_KV_SPLITS", "max_len", "stride_btb", "stride_plb",
           "stride_plh"]


# -- variant kernels -------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NOSPEC)
def _s1_ctrl(
    Q, K, BT, SL, PO, PL, qk_scale, max_len, GROUP, HEAD_BLOCKS, NUM_KV_SPLITS,
    stride_qb, stride_qh, stride_kb, stride_kp, stride_btb, stride_btp,
    stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    DV: tl.constexpr, DPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr,
):
    pid_h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    offs_g = (pid_h % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_g < GROUP
    heads = offs_g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < DV
    seq_len = tl.minimum(tl.maximum(tl.load(SL + b), 0), max_len)
    live = seq_len
    chunk = tl.maximum(tl.cdiv(tl.cdiv(live, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    q_row = b * stride_qb + heads[:, None] * stride_qh
    q = tl.load(Q + q_row + offs_d[None, :], mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    offs_pe = tl.arange(0, BLOCK_DPE)
    pe_mask = offs_pe < DPE
    q_pe = tl.load(Q + q_row + DV + offs_pe[None, :], mask=h_mask[:, None] & pe_mask[None, :],
                   other=0.0)
    if UPCAST:
        q_pe = q_pe.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    bt_row = BT + b * stride_btb
    offs_n = start + tl.arange(0, BLOCK_N)
    page = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=offs_n < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        offs_next = offs_n + BLOCK_N
        page_next = tl.load(bt_row + (offs_next // PAGE) * stride_btp, mask=offs_next < end,
                            other=0)
        page64 = page.to(tl.int64)
        in_page = offs_n % PAGE
        k_rows = page64 * stride_kb + in_page * stride_kp
        if EVICT:
            k = tl.load(K + k_rows[:, None] + offs_d[None, :],
                        mask=n_mask[:, None] & d_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
        else:
            k = tl.load(K + k_rows[:, None] + offs_d[None, :],
                        mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        if EVICT:
            k_pe = tl.load(K + k_rows[:, None] + DV + offs_pe[None, :],
                           mask=n_mask[:, None] & pe_mask[None, :], other=0.0,
                           eviction_policy="evict_first")
        else:
            k_pe = tl.load(K + k_rows[:, None] + DV + offs_pe[None, :],
                           mask=n_mask[:, None] & pe_mask[None, :], other=0.0)
        if UPCAST:
            k_pe = k_pe.to(tl.float32)
        s += tl.dot(q_pe, tl.trans(k_pe), input_precision=PREC)
        s = s * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PREC)
        m_i = m_new
        page = page_next
    has_work = start < end
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(PO + b * stride_pob + heads[:, None] * stride_poh + split * stride_pos
             + offs_d[None, :], out, mask=(h_mask & has_work)[:, None] & d_mask[None, :])
    tl.store(PL + b * stride_plb + heads * stride_plh + split, m_i + tl.log2(l_safe),
             mask=h_mask & has_work)


@triton.jit(do_not_specialize=_NOSPEC)
def _s1_half(
    Q, K, BT, SL, PO, PL, qk_scale, max_len, GROUP, HEAD_BLOCKS, NUM_KV_SPLITS,
    stride_qb, stride_qh, stride_kb, stride_kp, stride_btb, stride_btp,
    stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    DV: tl.constexpr, DPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr,
):
    # requires DV == BLOCK_D (even, power of two): the latent as two unmasked halves
    HALF: tl.constexpr = BLOCK_D // 2
    pid_h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    offs_g = (pid_h % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_g < GROUP
    heads = offs_g
    offs_c = tl.arange(0, HALF)
    seq_len = tl.minimum(tl.maximum(tl.load(SL + b), 0), max_len)
    live = seq_len
    chunk = tl.maximum(tl.cdiv(tl.cdiv(live, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    q_row = b * stride_qb + heads[:, None] * stride_qh
    q0 = tl.load(Q + q_row + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    q1 = tl.load(Q + q_row + HALF + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    offs_pe = tl.arange(0, BLOCK_DPE)
    pe_mask = offs_pe < DPE
    q_pe = tl.load(Q + q_row + DV + offs_pe[None, :], mask=h_mask[:, None] & pe_mask[None, :],
                   other=0.0)
    if UPCAST:
        q0 = q0.to(tl.float32)
        q1 = q1.to(tl.float32)
        q_pe = q_pe.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    bt_row = BT + b * stride_btb
    offs_n = start + tl.arange(0, BLOCK_N)
    page = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=offs_n < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        offs_next = offs_n + BLOCK_N
        page_next = tl.load(bt_row + (offs_next // PAGE) * stride_btp, mask=offs_next < end,
                            other=0)
        page64 = page.to(tl.int64)
        in_page = offs_n % PAGE
        k_rows = page64 * stride_kb + in_page * stride_kp
        kp = K + k_rows[:, None] + offs_c[None, :]
        k0 = tl.load(kp, mask=n_mask[:, None], other=0.0)
        k1 = tl.load(kp + HALF, mask=n_mask[:, None], other=0.0)
        k_pe = tl.load(K + k_rows[:, None] + DV + offs_pe[None, :],
                       mask=n_mask[:, None] & pe_mask[None, :], other=0.0)
        if UPCAST:
            k0 = k0.to(tl.float32)
            k1 = k1.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        s = tl.dot(q_pe, tl.trans(k_pe), input_precision=PREC)
        s = tl.dot(q0, tl.trans(k0), s, input_precision=PREC)
        s = tl.dot(q1, tl.trans(k1), s, input_precision=PREC)
        s = s * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pb = p.to(k0.dtype)
        acc0 = tl.dot(pb, k0, acc0 * alpha[:, None], input_precision=PREC)
        acc1 = tl.dot(pb, k1, acc1 * alpha[:, None], input_precision=PREC)
        m_i = m_new
        page = page_next
    has_work = start < end
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    po = PO + b * stride_pob + heads[:, None] * stride_poh + split * stride_pos + offs_c[None, :]
    st_mask = (h_mask & has_work)[:, None]
    tl.store(po, acc0 / l_safe[:, None], mask=st_mask)
    tl.store(po + HALF, acc1 / l_safe[:, None], mask=st_mask)
    tl.store(PL + b * stride_plb + heads * stride_plh + split, m_i + tl.log2(l_safe),
             mask=h_mask & has_work)


@triton.jit(do_not_specialize=_NOSPEC)
def _s1_tload(
    Q, K, BT, SL, PO, PL, qk_scale, max_len, GROUP, HEAD_BLOCKS, NUM_KV_SPLITS,
    stride_qb, stride_qh, stride_kb, stride_kp, stride_btb, stride_btp,
    stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    DV: tl.constexpr, DPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr,
):
    pid_h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    offs_g = (pid_h % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_g < GROUP
    heads = offs_g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < DV
    seq_len = tl.minimum(tl.maximum(tl.load(SL + b), 0), max_len)
    live = seq_len
    chunk = tl.maximum(tl.cdiv(tl.cdiv(live, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    q_row = b * stride_qb + heads[:, None] * stride_qh
    q = tl.load(Q + q_row + offs_d[None, :], mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    offs_pe = tl.arange(0, BLOCK_DPE)
    pe_mask = offs_pe < DPE
    q_pe = tl.load(Q + q_row + DV + offs_pe[None, :], mask=h_mask[:, None] & pe_mask[None, :],
                   other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        q_pe = q_pe.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    bt_row = BT + b * stride_btb
    offs_n = start + tl.arange(0, BLOCK_N)
    page = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=offs_n < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        offs_next = offs_n + BLOCK_N
        page_next = tl.load(bt_row + (offs_next // PAGE) * stride_btp, mask=offs_next < end,
                            other=0)
        page64 = page.to(tl.int64)
        in_page = offs_n % PAGE
        k_rows = page64 * stride_kb + in_page * stride_kp
        kt = tl.load(K + k_rows[None, :] + offs_d[:, None],
                     mask=n_mask[None, :] & d_mask[:, None], other=0.0)       # [D, N]
        kt_pe = tl.load(K + k_rows[None, :] + DV + offs_pe[:, None],
                        mask=n_mask[None, :] & pe_mask[:, None], other=0.0)  # [DPE, N]
        if UPCAST:
            kt = kt.to(tl.float32)
            kt_pe = kt_pe.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PREC)
        s += tl.dot(q_pe, kt_pe, input_precision=PREC)
        s = s * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(K + k_rows[:, None] + offs_d[None, :],
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)        # [N, D] again
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
        page = page_next
    has_work = start < end
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(PO + b * stride_pob + heads[:, None] * stride_poh + split * stride_pos
             + offs_d[None, :], out, mask=(h_mask & has_work)[:, None] & d_mask[None, :])
    tl.store(PL + b * stride_plb + heads * stride_plh + split, m_i + tl.log2(l_safe),
             mask=h_mask & has_work)


KERNELS = {"ctrl": (_s1_ctrl, False), "evict": (_s1_ctrl, True), "half": (_s1_half, False),
           "tload": (_s1_tload, False), "bh64": (_s1_ctrl, False)}


def _p2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def launch(variant: str, tile: tuple, splits: int, inp: dict, ws: dict) -> torch.Tensor:
    """tile = (block_n, num_warps, num_stages, block_h). Always split + _decode_reduce."""
    bn, warps, stages, bh = tile
    q, k = inp["q"], inp["k_cache"]
    b, hq, dk = q.shape
    _, page, hk, _ = k.shape
    dv = inp["v_cache"].shape[3]
    assert hk == 1 and inp["v_cache"].data_ptr() == k.data_ptr()
    kern, evict = KERNELS[variant]
    head_blocks = triton.cdiv(hq, bh)
    key = (b, hq, splits)
    if key not in ws:
        ws[key] = (torch.empty((b, hq, splits, dv), dtype=torch.float32, device=q.device),
                   torch.empty((b, hq, splits), dtype=torch.float32, device=q.device),
                   torch.empty((b, hq, dv), dtype=q.dtype, device=q.device))
    po, pl, out = ws[key]
    interp = os.environ.get("TRITON_INTERPRET", "") == "1"
    block_d = _p2(dv)
    bt, sl = inp["block_table"], inp["seq_lens"]
    max_len = bt.shape[1] * page
    kern[(head_blocks, splits, b)](
        q, k, bt, sl, po, pl, float(inp["scale"]) * LOG2E, max_len, hq, head_blocks, splits,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), bt.stride(0), bt.stride(1),
        po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        DV=dv, DPE=dk - dv, PAGE=page, BLOCK_D=block_d, BLOCK_DPE=max(16, _p2(dk - dv)),
        BLOCK_N=bn, BLOCK_H=bh, UPCAST=interp and q.dtype != torch.float32,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", EVICT=evict,
        num_warps=warps, num_stages=stages,
    )
    block_dv = min(block_d, 128)
    _decode_reduce[(hq, triton.cdiv(dv, block_dv), b)](
        sl, po, pl, out, 0, max_len, sl.stride(0), po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1), out.stride(0), out.stride(1),
        DV=dv, BLOCK_DV=block_dv, BLOCK_N=bn, NUM_KV_SPLITS=splits,
        SPLITS_P2=max(16, _p2(splits)), SPLIT_CHUNK=16, SLIDING=False,
        num_warps=4, num_stages=2,
    )
    return out


# -- plan -------------------------------------------------------------------------------------
# (name, batch, q heads, context, split counts tried, {variant: [tiles]})
T16 = {  # 12-16 heads: BLOCK_H 16 (bh64: 64); tile = (block_n, warps, stages, block_h)
    "ctrl": [(32, 4, 3, 16), (32, 4, 4, 16), (16, 4, 4, 16), (32, 8, 3, 16), (64, 8, 2, 16),
             (32, 2, 3, 16)],
    "evict": [(32, 4, 3, 16)],
    "half": [(32, 4, 3, 16), (32, 8, 3, 16), (32, 4, 4, 16), (64, 8, 2, 16)],
    "tload": [(32, 4, 3, 16), (32, 8, 3, 16)],
    "bh64": [(32, 8, 2, 64), (64, 8, 2, 64)],
}
T128 = {  # 128 heads
    "ctrl": [(64, 8, 2, 64), (32, 8, 3, 64), (32, 8, 2, 64), (32, 4, 3, 32)],
    "half": [(64, 8, 2, 64), (32, 8, 3, 64)],
    "tload": [(64, 8, 2, 64)],
}
PLAN = [
    ("kimi-k3-mla-b8-c327600", 8, 12, 327600, [33, 66, 16], T16),
    ("deepseek-v3-tp8-mla-b32-c16384", 32, 16, 16384, [8, 9, 16], T16),
    ("kimi-k3-mla-b1-c65536", 1, 12, 65536, [132, 264], T16),
    ("deepseek-v3-tp1-mla-b32-c16384", 32, 128, 16384, [1, 2, 4], T128),
]
SMOKE_PLAN = [
    ("smoke-12h", 2, 12, 150, [1, 3], T16),
    ("smoke-128h", 1, 128, 70, [2], {"ctrl": [(32, 4, 3, 32)], "half": [(16, 4, 2, 64)],
                                     "tload": [(16, 4, 2, 64)]}),
]


def make_sets(batch, hq, context, nsets, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    page, dk, dv = 16, 576, 512
    pages = -(-context // page)
    sets = []
    for _ in range(nsets):
        nb = batch * pages + 3
        q = torch.randn(batch, hq, dk, device=dev, generator=g).bfloat16()
        k = torch.empty(nb, page, 1, dk, device=dev, dtype=torch.bfloat16)
        k.normal_(generator=g)
        bt = torch.randperm(nb, device=dev, generator=g)[:batch * pages]
        bt = bt.view(batch, pages).to(torch.int32)
        sl = torch.full((batch,), context, dtype=torch.int32, device=dev)
        if batch > 1:  # one ragged request (still most of the context) exercises the masks
            sl[-1] = context - 37
        sets.append(dict(q=q, k_cache=k, v_cache=k[..., :dv], block_table=bt, seq_lens=sl,
                         scale=dk ** -0.5))
    return sets


def live_bytes(sets0) -> int:
    sl = sets0["seq_lens"].sum().item()
    b, hq, dk = sets0["q"].shape
    return sl * dk * 2 + b * hq * (dk + 512) * 2


def time_graph(fn, sets) -> tuple[float, float, float]:
    for inp in sets:
        fn(inp)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for inp in sets:
                fn(inp)
    torch.cuda.synchronize()
    q20, med, q80 = triton.testing.do_bench(graph.replay, warmup=10, rep=40,
                                            quantiles=[0.2, 0.5, 0.8])
    n = len(sets)
    return med * 1e3 / n, q20 * 1e3 / n, q80 * 1e3 / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, no timing (CPU ok)")
    ap.add_argument("--out", default="mla_variants.json")
    ap.add_argument("--time-limit", type=float, default=250.0,
                    help="stop starting new (variant, tile) entries after this many seconds")
    ap.add_argument("--only", default="", help="comma list of variants")
    args = ap.parse_args()
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    plan = SMOKE_PLAN if args.smoke else PLAN
    only = set(filter(None, args.only.split(",")))
    result = {"torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "command": " ".join(sys.argv), "rows": [],
              "lib": [], "skipped": []}
    ceiling = None
    if not args.smoke:
        from bench_decode import read_ceiling
        props = torch.cuda.get_device_properties(0)
        result["device"] = {"name": props.name, "sms": props.multi_processor_count}
        ceiling = read_ceiling(props.multi_processor_count)
        result["read_ceiling"] = ceiling
        print(f"read ceiling {ceiling['gbs']:.0f} GB/s ({time.time() - t0:.0f}s)", flush=True)

    def save():
        if not args.smoke or args.out != "mla_variants.json":
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1, default=str))

    for name, batch, hq, context, split_list, tiles in plan:
        ts = time.time()
        ws_bytes = batch * context * 576 * 2
        nsets = 1 if args.smoke else max(1, min(8, math.ceil(4 * L2_BYTES / ws_bytes)))
        sets = make_sets(batch, hq, context, nsets, seed=len(name) * 7 + batch, dev=dev)
        ref = reference_decode_attention(**sets[0])
        nbytes = live_bytes(sets[0])
        flops = 2 * sets[0]["seq_lens"].sum().item() * hq * (576 + 512)
        ws: dict = {}
        # the library's own heuristic launch, as a sanity anchor for ctrl
        if not args.smoke:
            try:
                from kdispatch.device import Device
                from kdispatch.kernels.decode_attention import SPEC, launch_decode_attention
                key = SPEC.key(Device.from_torch(sets[0]["q"].device), sets[0])
                h = SPEC.heuristic(key)
                o = launch_decode_attention(h, **sets[0])
                err = (o.float() - ref).abs().max().item()
                ok = torch.allclose(o.float(), ref, atol=2e-2, rtol=2e-2)
                us = time_graph(lambda i: launch_decode_attention(h, **i), sets) if ok else None
                result["lib"].append({"shape": name, "config": h.model_dump(), "max_err": err,
                                      "ok": ok, "us": us and us[0],
                                      "pct": us and 100 * nbytes / us[0] / 1e3 / ceiling["gbs"]})
                print(f"{name} lib-heuristic {h.model_dump()} "
                      f"{us[0] if us else float('nan'):.1f} us err {err:.2e}", flush=True)
            except Exception as exc:  # noqa: BLE001 - report and carry on
                result["lib"].append({"shape": name, "error": repr(exc)[:300]})
                print(f"{name} lib-heuristic failed: {exc!r}"[:300], flush=True)
        for variant, tlist in tiles.items():
            if only and variant not in only:
                continue
            for tile in tlist:
                if time.time() - t0 > args.time_limit:
                    result["skipped"].append([name, variant, tile])
                    continue
                for splits in split_list:
                    row = {"shape": name, "variant": variant, "block_n": tile[0],
                           "num_warps": tile[1], "num_stages": tile[2], "block_h": tile[3],
                           "splits": splits}
                    try:
                        tc = time.time()
                        out = launch(variant, tile, splits, sets[0], ws)
                        if dev == "cuda":
                            torch.cuda.synchronize()
                        row["first_call_s"] = round(time.time() - tc, 2)
                    except Exception as exc:  # noqa: BLE001 - infeasible configs are data
                        row["status"] = "error: " + repr(exc).splitlines()[0][:200]
                        result["rows"].append(row)
                        print(f"{name} {variant} {tile} s{splits}: {row['status']}", flush=True)
                        break
                    err = (out.float() - ref).abs().max().item()
                    row["max_err"] = err
                    if not torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2):
                        row["status"] = "wrong"
                        result["rows"].append(row)
                        print(f"{name} {variant} {tile} s{splits}: WRONG err {err:.3e}",
                              flush=True)
                        continue
                    row["status"] = "ok"
                    if not args.smoke:
                        us, q20, q80 = time_graph(
                            lambda i, v=variant, t=tile, s=splits: launch(v, t, s, i, ws), sets)
                        row.update(us=us, us_q20=q20, us_q80=q80,
                                   pct=100 * nbytes / us / 1e3 / ceiling["gbs"],
                                   tflops=flops / us / 1e6)
                        print(f"{name} {variant} {tile} s{splits}: {us:8.1f} us "
                              f"{row['pct']:5.1f}% err {err:.1e}", flush=True)
                    else:
                        print(f"{name} {variant} {tile} s{splits}: ok err {err:.2e}", flush=True)
                    result["rows"].append(row)
        del sets, ws
        if dev == "cuda":
            torch.cuda.empty_cache()
        print(f"  {name}: {time.time() - ts:.0f}s", flush=True)
        save()
    result["elapsed_s"] = time.time() - t0
    save()
    table(result)


def table(result) -> None:
    rows = [r for r in result["rows"] if r.get("status") == "ok" and "us" in r]
    if not rows:
        print("no timed rows")
        return
    print(f"\nread ceiling {result['read_ceiling']['gbs']:.0f} GB/s; "
          f"skipped {len(result['skipped'])}; {result['elapsed_s']:.0f}s")
    for lib in result["lib"]:
        if lib.get("us"):
            print(f"lib {lib['shape']:32s} {lib['us']:8.1f} us {lib['pct']:5.1f}%")
    print(f"{'shape':32s} {'variant':6s} {'best us':>8s} {'%ceil':>6s} {'TF':>5s}  "
          f"bn,w,st,bh splits")
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    for s in shapes:
        for v in KERNELS:
            rs = [r for r in rows if r["shape"] == s and r["variant"] == v]
            if not rs:
                continue
            r = min(rs, key=lambda r: r["us"])
            print(f"{s:32s} {v:6s} {r['us']:8.1f} {r['pct']:6.1f} {r['tflops']:5.0f}  "
                  f"{r['block_n']},{r['num_warps']},{r['num_stages']},{r['block_h']} "
                  f"{r['splits']}")
    bad = [r for r in result["rows"] if r.get("status") != "ok"]
    for r in bad:
        print(f"NOT OK {r['shape']} {r['variant']} {r['block_n']},{r['num_warps']},"
              f"{r['num_stages']},{r['block_h']} s{r['splits']}: {r['status']}")


if __name__ == "__main__":
    main()
