"""Session 31 experiment (not in the package): the narrow fp8 MLA tile without its fp16 V
tiles, so that two programs fit an SM.

The package's narrow tile (``gluon_mla_narrow``) converts each fp8 tile to an fp16 tile in
shared memory (2 x 64 KB), which the score and PV MMAs read: 225 KB, one 4-warp program
per SM, latency-bound at ~2.7 us a tile against ~1.1 us of reads (decode_notes v31). Here
both MMAs take their A operand from registers, converted from the fp8 ring stage 64
columns at a time: scores ``S^T [64 tokens, 16] = sum_c K_c q_c^T`` (K_c: the tile's 64
columns ``c``, tokens x columns), PV ``O^T_c [64, 16] += V^T_c P^T`` for each of the 8
64-column blocks ``c`` of O^T, each its own accumulator. Shared memory holds the TMA ring
(2 stages x 36 KB), q as fp16 (18 KB) and P (2 KB): ~94 KB, two programs per SM.

    PYTHONPATH=. python bench/results/nvidia-h200/session31/narrow_regs.py out.json
"""

from __future__ import annotations

import json
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kdispatch.kernels.decode_attention.gluon_mla_tiles import (_copy_tile, _mean_len,
                                                                _tile_ids)


@gluon.jit
def _k_chunk(kv, c: gl.constexpr, a_l: gl.constexpr):
    """The tile's columns ``[64 c, 64 c + 64)`` (tokens x columns) as an fp16 A operand."""
    return kv.slice(c * 64, 64, dim=1).load(a_l).to(gl.float16)


@gluon.jit
def _v_chunk(kv, c: gl.constexpr, lim, a_l: gl.constexpr, MASK: gl.constexpr):
    """V^T's rows ``[64 c, 64 c + 64)`` (columns x tokens) as an fp16 A operand; with
    ``MASK`` the tokens from ``lim`` on as zeros (a partial tile: what lies past the
    split's end may be any bytes, and P's zeros there must not meet a NaN)."""
    a = kv.slice(c * 64, 64, dim=1).permute((1, 0)).load(a_l).to(gl.float16)
    if MASK:
        tok = gl.arange(0, 64, layout=gl.SliceLayout(0, a_l))
        a = gl.where((tok < lim)[None, :], a, gl.zeros_like(a))
    return a


@gluon.jit
def _pv_step(kv, p, acc, v_prev, acc_prev, c: gl.constexpr, lim, a_l: gl.constexpr,
             MASK: gl.constexpr):
    """Issue block ``c``'s PV MMA, then wait the one before (its operand kept alive until
    it is done): returns block ``c``'s operand and token and block ``c - 1``'s result."""
    v = _v_chunk(kv, c, lim, a_l, MASK)
    t = warpgroup_mma(v, p, acc, is_async=True)
    done, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc_prev, v_prev))
    return v, t, done


@gluon.jit
def _pv(kv, p, a0, a1, a2, a3, a4, a5, a6, a7, lim, a_l: gl.constexpr,
        MASK: gl.constexpr):
    """``O^T_c += V^T_c P^T`` for the 8 blocks, block ``c``'s operand loaded while block
    ``c - 1`` runs; all waited."""
    v = _v_chunk(kv, 0, lim, a_l, MASK)
    t = warpgroup_mma(v, p, a0, is_async=True)
    v, t, a0 = _pv_step(kv, p, a1, v, t, 1, lim, a_l, MASK)
    v, t, a1 = _pv_step(kv, p, a2, v, t, 2, lim, a_l, MASK)
    v, t, a2 = _pv_step(kv, p, a3, v, t, 3, lim, a_l, MASK)
    v, t, a3 = _pv_step(kv, p, a4, v, t, 4, lim, a_l, MASK)
    v, t, a4 = _pv_step(kv, p, a5, v, t, 5, lim, a_l, MASK)
    v, t, a5 = _pv_step(kv, p, a6, v, t, 6, lim, a_l, MASK)
    v, t, a6 = _pv_step(kv, p, a7, v, t, 7, lim, a_l, MASK)
    a7, _ = warpgroup_mma_wait(num_outstanding=0, deps=(t, v))
    return a0, a1, a2, a3, a4, a5, a6, a7


@gluon.jit
def _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, acc, inv,
                 c: gl.constexpr, mask, col_o: gl.constexpr):
    cols = c * 64 + gl.arange(0, 64, layout=col_o)
    po = (PO + b * stride_pob + split * stride_pos + prow[None, :] * stride_poh
          + cols[:, None])
    gl.store(po, acc * inv[None, :], mask=mask[None, :])


@gluon.jit
def _narrow_regs_stage1(
    q_ptr, kv_desc, pe_desc, BT, SL, PO, PL, KS, VS,
    qk_scale, max_len, num_pages, heads, stride_qr,
    stride_btb, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    NUM_KV_SPLITS: gl.constexpr, NROWS: gl.constexpr, PAGE: gl.constexpr,
    DV: gl.constexpr, DPE: gl.constexpr, GRID_SPLITS: gl.constexpr, num_warps: gl.constexpr,
    QLEN: gl.constexpr = 1, STAGES: gl.constexpr = 2, KV_SCALED: gl.constexpr = False,
    F16_QK: gl.constexpr = True,
):
    gl.static_assert(num_warps == 4)
    gl.static_assert(NROWS == 16)
    gl.static_assert(DV == 512)
    TILE: gl.constexpr = 64
    b = gl.program_id(1)
    split = gl.program_id(2)
    seq_len = gl.minimum(gl.maximum(gl.load(SL + b), 0), max_len)
    chunk = gl.maximum(gl.cdiv(gl.cdiv(seq_len, GRID_SPLITS), TILE) * TILE, TILE)
    if GRID_SPLITS > NUM_KV_SPLITS:
        mean = _mean_len(SL, max_len, gl.num_programs(1), num_warps)
        chunk = gl.maximum(chunk, gl.cdiv(gl.cdiv(mean, NUM_KV_SPLITS), TILE) * TILE)
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    if split > 0 and end <= start:
        return
    n_tiles = gl.maximum(gl.cdiv(end - start, TILE), 0)
    bt_row = BT + b * stride_btb
    oob_row = num_pages * PAGE

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NROWS, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    tok_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])

    kv_smem = gl.allocate_shared_memory(kv_desc.dtype, [STAGES, TILE, DV], kv_desc.layout)
    pe_smem = gl.allocate_shared_memory(pe_desc.dtype, [STAGES, TILE, DPE], pe_desc.layout)
    p_smem = gl.allocate_shared_memory(
        gl.float16, [TILE, NROWS], gl.NVMMASharedLayout.get_default_for([TILE, NROWS],
                                                                        gl.float16))
    lq: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NROWS, 64], gl.float16)
    q_smem = gl.allocate_shared_memory(gl.float16, [9, NROWS, 64], lq)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
    fence_async_shared()

    for j in gl.static_range(STAGES):
        r0, r1, r2, r3, _ = _tile_ids(bt_row, start + j * TILE, end, j < n_tiles, num_pages,
                                      oob_row, TILE, PAGE)
        _copy_tile(kv_desc, pe_desc, kv_smem, pe_smem, ready, r0, r1, r2, r3, j < n_tiles, j,
                   TILE, PAGE)

    # q as fp16, 9 blocks of 64 columns (8 latent, the rope)
    q_row = q_ptr + (b * (QLEN * heads)).to(gl.int64) * stride_qr
    rq = gl.arange(0, NROWS, layout=gl.SliceLayout(1, q_l))
    live_q = rq < QLEN * heads
    for c in gl.static_range(9):
        cq = c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(0, q_l))
        x = gl.load(q_row + rq[:, None] * stride_qr + cq[None, :], mask=live_q[:, None],
                    other=0.0).to(gl.float32)
        q_smem.index(c).store(gl.minimum(gl.maximum(x, -65504.0), 65504.0).to(gl.float16))
    colmul = gl.full([NROWS], qk_scale, gl.float32, layout=row_s)
    if KV_SCALED:
        colmul = colmul * gl.load(KS)
    fence_async_shared()
    gl.thread_barrier()

    rows = gl.arange(0, NROWS, layout=row_s)
    row_end = gl.full([NROWS], 0, gl.int32, layout=row_s) + end
    if QLEN > 1:
        row_end = gl.minimum(seq_len - (QLEN - 1) + rows // heads, end)
    offs_t = gl.arange(0, TILE, layout=tok_s)
    if PAGE >= TILE:
        page_bit: gl.constexpr = 1
    else:
        page_bit = (1 << (offs_t // PAGE))[:, None]
    m_i = gl.full([NROWS], float("-inf"), gl.float32, layout=row_s)
    l_2d = gl.zeros([TILE, NROWS], gl.float32, layout=s_layout)
    zero = gl.zeros([TILE, NROWS], gl.float32, layout=s_layout)
    a0 = zero
    a1 = zero
    a2 = zero
    a3 = zero
    a4 = zero
    a5 = zero
    a6 = zero
    a7 = zero
    bits = _tile_ids(bt_row, start, end, n_tiles > 0, num_pages, oob_row, TILE, PAGE)[4]

    for i in range(n_tiles):
        st = i % STAGES
        n0 = start + i * TILE
        nxt = i + STAGES < n_tiles
        r0, r1, r2, r3, _ = _tile_ids(bt_row, n0 + STAGES * TILE, end, nxt, num_pages,
                                      oob_row, TILE, PAGE)
        bits_next = _tile_ids(bt_row, n0 + TILE, end, i + 1 < n_tiles, num_pages, oob_row,
                              TILE, PAGE)[4]
        mbarrier.wait(ready.index(st), (i // STAGES) & 1)
        kv = kv_smem.index(st)
        pe = pe_smem.index(st)
        # scores: 9 register-A MMAs, each block's operand loaded under the MMA before
        k = _k_chunk(kv, 0, a_l)
        s = warpgroup_mma(k, q_smem.index(0).permute((1, 0)), zero, use_acc=False,
                          is_async=True)
        for c in gl.static_range(1, 8):
            k_next = _k_chunk(kv, c, a_l)
            s = warpgroup_mma(k_next, q_smem.index(c).permute((1, 0)), s, is_async=True)
            k = warpgroup_mma_wait(num_outstanding=1, deps=(k,))  # (its MMA is done)
            k = k_next
        k_next = pe.load(a_l).to(gl.float16)
        s = warpgroup_mma(k_next, q_smem.index(8).permute((1, 0)), s, is_async=True)
        s, k, k_next = warpgroup_mma_wait(num_outstanding=0, deps=(s, k, k_next))
        visible = (((bits & page_bit) != 0) & ((n0 + offs_t) < end)[:, None]
                   & ((n0 + offs_t)[:, None] < row_end[None, :]))
        s = gl.where(visible, s * colmul[None, :], float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[None, :])
        l_2d = l_2d * alpha[None, :] + p
        m_i = m_new
        al = alpha[None, :]
        a0 = a0 * al
        a1 = a1 * al
        a2 = a2 * al
        a3 = a3 * al
        a4 = a4 * al
        a5 = a5 * al
        a6 = a6 * al
        a7 = a7 * al
        p_smem.store(p.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        lim = end - n0
        if lim < TILE:
            a0, a1, a2, a3, a4, a5, a6, a7 = _pv(kv, p_smem, a0, a1, a2, a3, a4, a5, a6, a7,
                                                 lim, a_l, True)
        else:
            a0, a1, a2, a3, a4, a5, a6, a7 = _pv(kv, p_smem, a0, a1, a2, a3, a4, a5, a6, a7,
                                                 lim, a_l, False)
        # every warp has its V in registers: the stage's next copy leaves
        gl.thread_barrier()
        _copy_tile(kv_desc, pe_desc, kv_smem, pe_smem, ready, r0, r1, r2, r3, nxt, st, TILE,
                   PAGE)
        bits = bits_next

    l_i = gl.sum(l_2d, 0)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    inv = 1.0 / l_safe
    if KV_SCALED:
        inv = inv * gl.load(VS)
    prow = (rows % heads) * QLEN + rows // heads
    mask = (n_tiles > 0) & (rows < QLEN * heads)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a0, inv, 0, mask, tok_s)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a1, inv, 1, mask, tok_s)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a2, inv, 2, mask, tok_s)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a3, inv, 3, mask, tok_s)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a4, inv, 4, mask, tok_s)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a5, inv, 5, mask, tok_s)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a6, inv, 6, mask, tok_s)
    _store_block(PO, b, split, stride_pob, stride_pos, stride_poh, prow, a7, inv, 7, mask, tok_s)
    gl.store(PL + b * stride_plb + prow * stride_plh + split, m_i + gl.log2(l_safe),
             mask=mask)


def regs_launches(cfg, q, k, bt, sl, scale, k_scale, out):
    """The package's planned launches for the narrow config ``cfg`` with this stage 1 in
    place of its own (same arguments, grid and reduce)."""
    from kdispatch.kernels.decode_attention.launch import planned_launches

    ls = planned_launches(cfg, q, k, k[..., :512], bt, sl, scale=scale, out=out,
                          k_scale=k_scale, v_scale=k_scale)
    s1 = ls[0]
    assert getattr(getattr(s1.fn, "fn", None), "__name__", "") == "_narrow_stage1", s1.fn
    ls[0] = type(s1)(_narrow_regs_stage1, s1.grid, s1.args, s1.constexprs, s1.options)
    return ls


def main(path: str) -> None:
    sys.path.insert(0, "tools")
    from bench_decode import Shape, make_sets, time_fns

    import kdispatch
    from kdispatch.kernels._common import quantize_fp8
    from kdispatch.kernels.decode_attention import reference_decode_attention
    from kdispatch.kernels.decode_attention.spec import narrow_config

    DK = 576
    res = {"checks": [], "times": []}
    for hq, page in ((16, 16), (12, 64), (16, 32)):
        g = torch.Generator(device="cuda").manual_seed(hq + page)
        b, ctx = 8, 4096
        pages = ctx // page
        nb = b * pages + 5
        ks = torch.full((1,), 0.02, device="cuda")
        k = quantize_fp8(torch.randn(nb, page, 1, DK, device="cuda", generator=g), ks,
                         torch.float8_e4m3fn)
        bt = torch.randperm(nb, device="cuda", generator=g)[:b * pages].view(b, pages).int()
        sl = torch.tensor([1, 15, 16, 17, 63, 64, 65, ctx], dtype=torch.int32, device="cuda")
        for s, scale in ((0.02, 3), (0.5, 1)):
            ks.fill_(s)
            q = torch.randn(b, hq, DK, device="cuda", generator=g).to(torch.bfloat16)
            ref = reference_decode_attention(q, k, k[..., :512], bt, sl, scale=DK ** -0.5,
                                             k_scale=ks, v_scale=ks).float()
            out = torch.empty(b, hq, 512, device="cuda", dtype=torch.bfloat16)
            for L in regs_launches(narrow_config(scale, hq), q, k, bt, sl, DK ** -0.5, ks, out):
                L.run()
            base = kdispatch.decode_attention(q, k, k[..., :512], bt, sl, scale=DK ** -0.5,
                                              k_scale=ks, v_scale=ks,
                                              config=narrow_config(scale, hq)).float()
            torch.cuda.synchronize()
            row = {"heads": hq, "page": page, "scale": s, "splits": scale,
                   "regs_err": (out.float() - ref).abs().max().item(),
                   "narrow_err": (base - ref).abs().max().item()}
            print(row, flush=True)
            res["checks"].append(row)
    json.dump(res, open(path, "w"), indent=1)

    for name, b, hq, ctx, sps in (("ds-b32", 32, 16, 16384, (4, 8)),
                                  ("kimi-b8", 8, 12, 327600, (33, 66)),
                                  ("kimi-b1", 1, 12, 65536, (128,))):
        sets = make_sets(Shape(name, b, hq, 1, DK, 512, ctx, kv="fp8"), 2, 0)
        fns = {}
        for sp in sps:
            base, regs = [], []
            for inp in sets:
                o1 = torch.empty(b, hq, 512, device="cuda", dtype=torch.bfloat16)
                o2 = torch.empty_like(o1)
                args = (inp["q"], inp["k_cache"], inp["block_table"], inp["seq_lens"])
                base.append(lambda a=args, o=o1, sp=sp, inp=inp: kdispatch.decode_attention(
                    a[0], a[1], a[1][..., :512], a[2], a[3], scale=inp["scale"], out=o,
                    k_scale=inp["k_scale"], v_scale=inp["v_scale"],
                    config=narrow_config(sp, hq)))
                ls = regs_launches(narrow_config(sp, hq), *args, inp["scale"], inp["k_scale"],
                                   o2)
                regs.append(lambda ls=ls: [x.run() for x in ls])
            fns[f"narrow-s{sp}"], fns[f"regs-s{sp}"] = base, regs
        times = {f: [] for f in fns}
        for r in range(2):
            for f in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
                times[f].append(time_fns(fns[f])[0])
        best = {f: min(v) for f, v in times.items()}
        print(name, {f: round(v, 1) for f, v in best.items()}, flush=True)
        res["times"].append({"case": name, "best_of_rounds_us": best, "rounds": times})
        json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
