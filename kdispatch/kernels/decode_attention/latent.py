"""``_decode_stage1_latent``: stage 1 for a shared latent (absorbed MLA) with a power-of-two
``Dv >= 512``, the latent loaded as two half-width tiles.

The same work as :func:`~kdispatch.kernels.decode_attention.kernels._decode_stage1` with
``SHARED_KV``: rows are (new token, head) pairs, token-major, so with several query tokens
per request (``QLEN``: speculative decoding, multi-token prediction) every latent tile
feeds ``QLEN x heads`` rows of the dots -- what makes MLA with MTP compute-bound rather
than reading the latent once per token. fp8 latents (``KV_FP8``) are loaded as fp8 and
converted in registers (to fp16 for fp16 dots, ``F16_DOTS``); their scales are read by
the kernel. A page id outside ``[0, num_blocks)`` is never dereferenced (its rows read
the zero row ``KZ`` at the 64-row tiles and are masked out of the loads at narrower
ones, whose splits run unguarded loads when their ids were all found in the cache) and its
tokens' scores are -inf.
"""

import triton
import triton.language as tl

from kdispatch.kernels.decode_attention.kernels import (
    _dequant,
    _dot_operand,
    _merge_if_last,
    _row_ptrs,
    _scores_scale,
    _softmax_step,
    _split_range,
    _tile_pages,
    _tile_rows,
    _visible,
)


@triton.jit
def _pages_valid(bt_row, start, end, num_blocks, stride_btp, PAGE: tl.constexpr,
                 SCAN: tl.constexpr):
    """Whether every page id of tokens ``[start, end)`` lies in ``[0, num_blocks)``: one
    vectorized pass over the split's ids (a few hundred at most), before the loop."""
    p_end = tl.cdiv(end, PAGE)
    bad = start * 0
    for p0 in range(start // PAGE, p_end, SCAN):
        offs = p0 + tl.arange(0, SCAN)
        ids = tl.load(bt_row + offs * stride_btp, mask=offs < p_end, other=0)
        bad += tl.sum((ids.to(tl.uint32, bitcast=True) >= num_blocks).to(tl.int32), 0)
    return bad == 0


@triton.jit
def _latent_tiles(K, KZ, bt_row, q0, q1, q_pe, m_i, l_i, acc0, acc1, start, end, num_blocks,
                  k_head, qk_scale, cap, row_end, row_lo, stride_kb, stride_kp, stride_btp,
                  clean, PAGE: tl.constexpr, DV: tl.constexpr, DPE: tl.constexpr,
                  BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr,
                  ZERO_ROW: tl.constexpr, QLEN: tl.constexpr, SLIDING: tl.constexpr,
                  LOGIT_CAP: tl.constexpr, UPCAST: tl.constexpr, KV_FP8: tl.constexpr,
                  ASM_CVT: tl.constexpr, PREC: tl.constexpr, GUARD: tl.constexpr):
    """The tile loop of a split: ``(m_i, l_i, acc0, acc1)`` after its tokens ``[start, end)``.

    ``GUARD``: a page id outside the cache is never dereferenced. At the 64-row tiles
    (``ZERO_ROW``) its rows point at the zero row ``KZ`` and the loads are masked by the
    token range only (a mask by page validity makes the async copies wait on the page-id
    loads, which ptxas then schedules just before them: ~7% at 128 heads); at narrower
    tiles the loads are masked by page validity (fewer instructions than the pointer
    select). Without ``GUARD`` (a narrow tile's split whose ids were all found in the
    cache) the loads are masked by the token range alone. ``clean`` (whether the split's
    ids were all found in the cache) lets the scores skip the reload of the tile's ids.
    """
    offs_c = tl.arange(0, HALF)
    if BLOCK_DPE > 0:
        offs_pe = tl.arange(0, BLOCK_DPE)
        pe_mask = offs_pe < DPE
    offs_n = start + tl.arange(0, BLOCK_N)
    page = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=offs_n < end, other=-1)
    for n0 in range(start, end, BLOCK_N):
        offs_n, in_range, readable, page64, in_page, page_next = _tile_pages(
            bt_row, n0, end, page, num_blocks, stride_btp, PAGE, BLOCK_N)
        if GUARD and ZERO_ROW:
            k_row = _row_ptrs(K, page64, in_page, k_head, readable, stride_kb, stride_kp, KZ)
        else:
            k_row = K + (page64 * stride_kb + in_page * stride_kp + k_head)
        if GUARD and not ZERO_ROW:
            load_ok = readable
        else:
            load_ok = in_range
        kp = k_row[:, None] + offs_c[None, :]
        k0 = tl.load(kp, mask=load_ok[:, None], other=0.0)
        k1 = tl.load(kp + HALF, mask=load_ok[:, None], other=0.0)
        if UPCAST or KV_FP8:  # to the dot dtype in registers (fp8: dequantized, staged as
            k0 = _dequant(k0, q0.dtype, ASM_CVT)  # fp16 for both dots)
            k1 = _dequant(k1, q0.dtype, ASM_CVT)
        if BLOCK_DPE > 0:  # rope tail first, then the halves accumulate into its scores
            k_pe = tl.load(k_row[:, None] + DV + offs_pe[None, :],
                           mask=load_ok[:, None] & pe_mask[None, :], other=0.0)
            if UPCAST or KV_FP8:
                k_pe = k_pe.to(q0.dtype)
            s = tl.dot(q_pe, tl.trans(k_pe), input_precision=PREC)
            s = tl.dot(q0, tl.trans(k0), s, input_precision=PREC)
        else:
            s = tl.dot(q0, tl.trans(k0), input_precision=PREC)
        s = tl.dot(q1, tl.trans(k1), s, input_precision=PREC)
        s = _scores_scale(s, qk_scale, cap, LOGIT_CAP)
        s = _visible(s, offs_n, in_range, row_end, row_lo, bt_row, num_blocks, stride_btp,
                     PAGE, QLEN, SLIDING, BLOCK_N, clean)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        pb = p.to(k0.dtype)
        acc0 = tl.dot(pb, k0, acc0 * alpha[:, None], input_precision=PREC)
        acc1 = tl.dot(pb, k1, acc1 * alpha[:, None], input_precision=PREC)
        page = page_next
    return m_i, l_i, acc0, acc1


@triton.jit
def _decode_stage1_latent(
    Q, K, BT, SL, O, PO, PL, CNT, KS, VS, KZ,
    qk_scale, cap, window, max_len, num_blocks,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kp, stride_kh,
    stride_btb, stride_btp, stride_sl,
    stride_ob, stride_ot, stride_oh,
    stride_pob, stride_poh, stride_pos,
    stride_plb, stride_plh, stride_cnt,
    GROUP: tl.constexpr, PAGE: tl.constexpr, DV: tl.constexpr, DPE: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr, NUM_KV_SPLITS: tl.constexpr,
    SLIDING: tl.constexpr, LOGIT_CAP: tl.constexpr,
    UPCAST: tl.constexpr, DIRECT: tl.constexpr, PREC: tl.constexpr, USE_PDL: tl.constexpr,
    MERGE: tl.constexpr, BLOCK_C: tl.constexpr, SPLITS_P2: tl.constexpr,
    QLEN: tl.constexpr, KV_FP8: tl.constexpr, KV_SCALED: tl.constexpr,
    F16_DOTS: tl.constexpr, ASM_CVT: tl.constexpr, GRID_SPLITS: tl.constexpr,
):
    """Stage 1 for a shared latent (``SHARED_KV``) with ``DV == BLOCK_D``: the latent as halves.

    The ``DV`` latent columns are loaded as two ``DV / 2``-wide tiles (no column mask:
    ``DV`` is a power of two), QK is three dots (rope tail, low half, high half) and PV two
    dots into two accumulators. H200, DV 512 (``tools/experiments/mla_variants.py``,
    docs/decode_notes.md v3): 10% faster than the single 512-wide tile at kimi b8 x 327,600
    (715 vs 798 us).
    """
    HALF: tl.constexpr = BLOCK_D // 2
    ZERO_ROW: tl.constexpr = BLOCK_H >= 64  # how a bad page is kept out of the loads
    PAGE_SCAN: tl.constexpr = 256
    if USE_PDL:  # the reduce may launch now; it waits for this grid before reading
        tl.extra.cuda.gdc_launch_dependents()
    pid_h = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    offs_c = tl.arange(0, HALF)

    seq_len, live, chunk, start, end = _split_range(
        SL, b, stride_sl, window, max_len, split, tl.num_programs(1), NUM_KV_SPLITS, BLOCK_N,
        SLIDING, QLEN, GRID_SPLITS)
    if split > 0 and start >= end:  # an empty split: nothing to store, no ticket to take
        return
    kvh, r_mask, q_off, o_off, prow, row_end, row_lo = _tile_rows(
        pid_h, b, seq_len, window, stride_qb, stride_qt, stride_qh, stride_ob, stride_ot,
        stride_oh, GROUP, BLOCK_H, HEAD_BLOCKS, QLEN, SLIDING)
    if KV_SCALED:  # dequantized latent (as K) = stored * k_scale: into the score scale
        qk_scale = qk_scale * tl.load(KS)

    q_row = Q + q_off[:, None]
    q0 = _dot_operand(tl.load(q_row + offs_c[None, :], mask=r_mask[:, None], other=0.0),
                      UPCAST, F16_DOTS)
    q1 = _dot_operand(tl.load(q_row + HALF + offs_c[None, :], mask=r_mask[:, None], other=0.0),
                      UPCAST, F16_DOTS)
    if BLOCK_DPE > 0:
        offs_pe = tl.arange(0, BLOCK_DPE)
        pe_mask = offs_pe < DPE
        q_pe = tl.load(q_row + DV + offs_pe[None, :], mask=r_mask[:, None] & pe_mask[None, :],
                       other=0.0)
        q_pe = _dot_operand(q_pe, UPCAST, F16_DOTS)
    else:  # no rope tail: unused by the tiles
        q_pe = q0

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    k_head = kvh * stride_kh
    bt_row = BT + b * stride_btb
    clean = _pages_valid(bt_row, start, end, num_blocks, stride_btp, PAGE, PAGE_SCAN)
    if ZERO_ROW:  # one loop: bad rows read the zero row; a clean split skips the id reload
        m_i, l_i, acc0, acc1 = _latent_tiles(
            K, KZ, bt_row, q0, q1, q_pe, m_i, l_i, acc0, acc1, start, end, num_blocks,
            k_head, qk_scale, cap, row_end, row_lo, stride_kb, stride_kp, stride_btp, clean,
            PAGE, DV, DPE, BLOCK_DPE, BLOCK_N, HALF, True, QLEN, SLIDING, LOGIT_CAP,
            UPCAST, KV_FP8, ASM_CVT, PREC, True)
    elif clean:  # narrower tiles, the serving case: loads by the token range alone
        m_i, l_i, acc0, acc1 = _latent_tiles(
            K, KZ, bt_row, q0, q1, q_pe, m_i, l_i, acc0, acc1, start, end, num_blocks,
            k_head, qk_scale, cap, row_end, row_lo, stride_kb, stride_kp, stride_btp, True,
            PAGE, DV, DPE, BLOCK_DPE, BLOCK_N, HALF, False, QLEN, SLIDING, LOGIT_CAP,
            UPCAST, KV_FP8, ASM_CVT, PREC, False)
    else:  # a split holding a bad id: loads masked by page validity
        m_i, l_i, acc0, acc1 = _latent_tiles(
            K, KZ, bt_row, q0, q1, q_pe, m_i, l_i, acc0, acc1, start, end, num_blocks,
            k_head, qk_scale, cap, row_end, row_lo, stride_kb, stride_kp, stride_btp, False,
            PAGE, DV, DPE, BLOCK_DPE, BLOCK_N, HALF, False, QLEN, SLIDING, LOGIT_CAP,
            UPCAST, KV_FP8, ASM_CVT, PREC, True)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    if KV_SCALED:  # dequantized latent (as V) = stored * v_scale
        inv = tl.load(VS) / l_safe
        out0 = acc0 * inv[:, None]
        out1 = acc1 * inv[:, None]
    else:
        out0 = acc0 / l_safe[:, None]
        out1 = acc1 / l_safe[:, None]
    if DIRECT:
        o = O + o_off[:, None] + offs_c[None, :]
        tl.store(o, out0.to(O.dtype.element_ty), mask=r_mask[:, None])
        tl.store(o + HALF, out1.to(O.dtype.element_ty), mask=r_mask[:, None])
    else:
        has_work = start < end
        po = (PO + b * stride_pob + prow[:, None] * stride_poh + split * stride_pos
              + offs_c[None, :])
        tl.store(po, out0, mask=(r_mask & has_work)[:, None])
        tl.store(po + HALF, out1, mask=(r_mask & has_work)[:, None])
        tl.store(PL + b * stride_plb + prow * stride_plh + split, m_i + tl.log2(l_safe),
                 mask=r_mask & has_work)
        if MERGE:
            _merge_if_last(CNT, PO, PL, O, b, pid_h, prow, o_off, r_mask, tl.cdiv(live, chunk),
                           stride_cnt, stride_pob, stride_poh, stride_pos, stride_plb,
                           stride_plh, DV, BLOCK_H, BLOCK_C, SPLITS_P2)
