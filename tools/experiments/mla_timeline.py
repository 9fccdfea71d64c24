"""Per-program timeline of the MLA stage 1 (start, loop end, end, SM) from %globaltimer.

The kernel is ``mla_variants._s1_half`` (the library's ``_decode_stage1_latent`` minus its
options) with three clock reads; the timeline shows where a short-context launch loses
time: programs starting late, a long fill, or a spread of finishing times (the tail).

The single-launch rows' ``event_us`` also holds the host's launch latency (events around
one Python launch); read their spans and the graph rows' per-call times instead.

    python tools/experiments/mla_timeline.py --out $OUT/mla_timeline.json
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
sys.path.insert(0, str(ROOT / "tools" / "experiments"))

from mla_variants import _NOSPEC, LOG2E, _p2, make_sets  # noqa: E402


@triton.jit
def _clock():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit(do_not_specialize=_NOSPEC)
def _s1_timed(
    TS, Q, K, BT, SL, PO, PL, qk_scale, max_len, GROUP, HEAD_BLOCKS, NUM_KV_SPLITS,
    stride_qb, stride_qh, stride_kb, stride_kp, stride_btb, stride_btp,
    stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    DV: tl.constexpr, DPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr,
):
    # requires DV == BLOCK_D (even, power of two): the latent as two unmasked halves
    HALF: tl.constexpr = BLOCK_D // 2
    t_start = _clock()
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
    t_loop = _clock()
    has_work = start < end
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    po = PO + b * stride_pob + heads[:, None] * stride_poh + split * stride_pos + offs_c[None, :]
    st_mask = (h_mask & has_work)[:, None]
    tl.store(po, acc0 / l_safe[:, None], mask=st_mask)
    tl.store(po + HALF, acc1 / l_safe[:, None], mask=st_mask)
    tl.store(PL + b * stride_plb + heads * stride_plh + split, m_i + tl.log2(l_safe),
             mask=h_mask & has_work)
    t_end = _clock()
    row = TS + ((b * NUM_KV_SPLITS + split) * HEAD_BLOCKS + pid_h) * 4
    tl.store(row, t_start)
    tl.store(row + 1, t_loop)
    tl.store(row + 2, t_end)
    tl.store(row + 3, _smid().to(tl.int64))


def run(batch, hq, context, splits, bn=32, warps=4, stages=3) -> dict:
    inp = make_sets(batch, hq, context, 1, seed=5, dev="cuda")[0]
    q, k, bt, sl = inp["q"], inp["k_cache"], inp["block_table"], inp["seq_lens"]
    b, hq, dk = q.shape
    page, dv = k.shape[1], 512
    po = torch.empty((b, hq, splits, dv), dtype=torch.float32, device="cuda")
    pl = torch.empty((b, hq, splits), dtype=torch.float32, device="cuda")
    ts = torch.zeros((b * splits, 4), dtype=torch.int64, device="cuda")

    def go():
        _s1_timed[(1, splits, b)](
            ts, q, k, bt, sl, po, pl, float(inp["scale"]) * LOG2E, bt.shape[1] * page, hq, 1,
            splits, q.stride(0), q.stride(1), k.stride(0), k.stride(1), bt.stride(0),
            bt.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
            DV=dv, DPE=dk - dv, PAGE=page, BLOCK_D=dv, BLOCK_DPE=_p2(dk - dv), BLOCK_N=bn,
            BLOCK_H=16, UPCAST=False, PREC="tf32", EVICT=False, num_warps=warps,
            num_stages=stages)
    for _ in range(3):
        go()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        go()
        e1.record()
        torch.cuda.synchronize()
        t = ts.cpu().double()
        t0 = t[:, 0].min()
        start, loop, end = (t[:, 0] - t0) / 1e3, (t[:, 1] - t0) / 1e3, (t[:, 2] - t0) / 1e3
        q_ = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
        sms = t[:, 3].long()
        per_sm = torch.zeros(int(sms.max()) + 1, dtype=torch.float64).index_add_(
            0, sms, end - start)
        runs.append({
            "event_us": e0.elapsed_time(e1) * 1e3,
            "span_us": float(end.max()),
            "start_q": start.quantile(q_).tolist(),
            "loop_end_q": loop.quantile(q_).tolist(),
            "end_q": end.quantile(q_).tolist(),
            "dur_q": (end - start).quantile(q_).tolist(),
            "epilogue_q": (end - loop).quantile(q_).tolist(),
            "programs_per_sm": torch.bincount(sms).tolist(),
            "busy_per_sm_q": per_sm[per_sm > 0].quantile(q_).tolist(),
        })
    return {"batch": batch, "hq": hq, "context": context, "splits": splits, "block_n": bn,
            "num_warps": warps, "num_stages": stages, "bytes": b * context * 1152,
            "runs": runs}


def graph_gaps(batch, hq, context, splits, with_reduce, nsets=4, bn=32, warps=4,
               stages=3) -> dict:
    """Back-to-back launches in one CUDA graph: each launch's span and the gaps between."""
    from kdispatch.kernels.decode_attention import _decode_reduce
    sets = make_sets(batch, hq, context, nsets, seed=7, dev="cuda")
    b, hq, dk = sets[0]["q"].shape
    page, dv = sets[0]["k_cache"].shape[1], 512
    po = torch.empty((b, hq, splits, dv), dtype=torch.float32, device="cuda")
    pl = torch.empty((b, hq, splits), dtype=torch.float32, device="cuda")
    out = torch.empty((b, hq, dv), dtype=torch.bfloat16, device="cuda")
    ts = torch.zeros((nsets, b * splits, 4), dtype=torch.int64, device="cuda")

    def go(i):
        inp = sets[i]
        q, k, bt, sl = inp["q"], inp["k_cache"], inp["block_table"], inp["seq_lens"]
        _s1_timed[(1, splits, b)](
            ts[i], q, k, bt, sl, po, pl, float(inp["scale"]) * LOG2E, bt.shape[1] * page, hq,
            1, splits, q.stride(0), q.stride(1), k.stride(0), k.stride(1), bt.stride(0),
            bt.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
            DV=dv, DPE=dk - dv, PAGE=page, BLOCK_D=dv, BLOCK_DPE=_p2(dk - dv), BLOCK_N=bn,
            BLOCK_H=16, UPCAST=False, PREC="tf32", EVICT=False, num_warps=warps,
            num_stages=stages)
        if with_reduce:
            _decode_reduce[(hq, dv // 128, b)](
                sl, po, pl, out, 0, bt.shape[1] * page, sl.stride(0), po.stride(0),
                po.stride(1), po.stride(2), pl.stride(0), pl.stride(1), out.stride(0),
                out.stride(1), DV=dv, BLOCK_DV=128, BLOCK_N=bn, NUM_KV_SPLITS=splits,
                SPLITS_P2=max(16, _p2(splits)), SPLIT_CHUNK=16, SLIDING=False, USE_PDL=False,
                num_warps=4, num_stages=2)
    for i in range(nsets):
        go(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream()
    with torch.cuda.stream(st), torch.cuda.graph(g, stream=st):
        for i in range(nsets):
            go(i)
    torch.cuda.synchronize()
    for _ in range(3):
        g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    per_call = e0.elapsed_time(e1) * 1e3 / reps / nsets
    t = ts.cpu().double()
    starts, ends = t[:, :, 0].min(1).values, t[:, :, 2].max(1).values
    spans = ((ends - starts) / 1e3).tolist()
    gaps = ((starts[1:] - ends[:-1]) / 1e3).tolist()
    return {"batch": batch, "context": context, "splits": splits, "with_reduce": with_reduce,
            "per_call_us": per_call, "spans_us": spans, "gaps_us": gaps,
            "bytes": b * context * 1152}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="mla_timeline.json")
    args = ap.parse_args()
    res = {"torch": torch.__version__, "triton": triton.__version__, "rows": [], "graph": []}
    for batch, context, splits in ((32, 16384, 8), (32, 65536, 8), (8, 327600, 33)):
        for with_reduce in (False, True):
            r = graph_gaps(batch, 16, context, splits, with_reduce)
            res["graph"].append(r)
            f = lambda v: "/".join(f"{x:.1f}" for x in v)  # noqa: E731
            print(f"graph b{batch} c{context} s{splits} reduce={with_reduce}: "
                  f"{r['per_call_us']:.1f} us per call; spans {f(r['spans_us'])}; "
                  f"gaps {f(r['gaps_us'])}", flush=True)
            torch.cuda.empty_cache()
    for batch, context, splits in ((32, 16384, 8), (32, 16384, 16), (32, 65536, 8),
                                   (8, 16384, 32), (8, 327600, 33)):
        r = run(batch, 16, context, splits)
        res["rows"].append(r)
        m = sorted(r["runs"], key=lambda x: x["event_us"])[2]
        f = lambda v: "/".join(f"{x:.1f}" for x in v)  # noqa: E731
        print(f"b{batch} c{context} s{splits}: event {m['event_us']:.1f} us, span "
              f"{m['span_us']:.1f}; start q0/10/50/90/100 {f(m['start_q'])}; dur "
              f"{f(m['dur_q'])}; end {f(m['end_q'])}; epilogue {f(m['epilogue_q'])}; "
              f"SM busy {f(m['busy_per_sm_q'])}; {r['bytes'] / m['event_us'] / 1e3:.0f} GB/s",
              flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
