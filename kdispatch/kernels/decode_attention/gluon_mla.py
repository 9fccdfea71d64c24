"""A Gluon stage 1 for absorbed-MLA split-KV decode on sm_90 (``kernel="gluon"``).

Issue 18's compute-bound regime: 64 rows of one request per program (two warpgroups,
``num_warps=8``), one latent KV head whose rows are 576 wide (512 latent + 64 rope; V is
the first 512 columns of the same row), bf16 or fp8 (below), 16-, 32- or 64-token pages
(``PAGE``) in 64-token tiles (``BLOCK_N``). A request's rows are its
``QLEN x H`` (new token, head) pairs, token-major as in the Triton latent stage 1
(``_tile_rows``): row ``r`` is token ``r // H``, head ``r % H``, and sees the tokens
``[0, seq_len - QLEN + 1 + r // H)`` (causal among the new tokens); the request's rows
fill ``cdiv(QLEN * H, 64)`` programs, the last one's rows past ``QLEN * H`` are padding
(q read from the next request or zero-filled by TMA, finite scores, nothing stored).
Per 64-token tile step:

- the tile's ``64 // PAGE`` pages arrive by TMA (each page two copies, ``PAGE``-row boxes
  of two descriptors over the same cache: the 512 latent columns and the 64 rope columns,
  into rows ``j * PAGE`` of the stage's tile) into a 2-stage shared-memory ring with one
  mbarrier per stage (all ``64 // PAGE`` pages are always copied: the tile's bytes are one
  constant); q (64 x 576) is loaded by TMA once and stays in shared memory;
- ``S = q_pe k_pe^T + q_lat k_lat^T`` by warpgroup MMA (64 x 64, each warpgroup 32 of
  the 64 token columns), the online softmax in registers (log2 units);
- ``P`` (bf16) goes through shared memory and ``O += P V`` by warpgroup MMA reads V from
  the same latent tile; the output's 512 columns are split between the two warpgroups
  (each holds a 64 x 256 fp32 accumulator, 128 registers a thread).

The copies come from a warp of their own (``gl.warp_specialize``: :func:`_producer`, 32
registers, in a third warpgroup whose other warps idle; the two warpgroups
(:func:`_consumer`) take the registers that frees, 240). It loads a tile's page ids, waits
until the consumers released the stage (``empty``), and issues the tile's copies, which
complete the stage's ``ready`` mbarrier; the consumers release a stage once both
warpgroups' MMAs on it are done (a bf16 stage after its PV MMA, an fp8 one after its
conversion). Before (session 21) the two warpgroups issued the copies themselves, and
the compiler puts a CTA barrier before each copy: 8 copies and 9 barriers a tile at
16-token pages. Now their loop has no copy and no barrier of a copy: at 16-token pages
0.90x the time (128 heads) and 0.88x (16 heads x 2 tokens), at 64-token pages 0.98x
(docs/decode_notes.md v22). The PV MMA is still waited at the end of each tile (a PV MMA
left in flight into the next tile's score MMA makes ptxas serialize the wgmmas, C7515 or
C7514 by the form: v12, v21).

An fp8 (e4m3) latent (``KV_FP8``) arrives by TMA as bytes into the ring; each tile step
converts its stage to one fp16 tile (exact; the last tile's V rows past the split's end as
zeros) that both dots read, q is rewritten as fp16 in place once (bf16 values convert
exactly within fp16's range, saturating beyond it) and P is fp16: the same shared memory
as the bf16 ring (two fp8 stages and one fp16 tile). ``KV_SCALED``: ``k_scale`` (read on
the device) multiplies the score scale and ``v_scale`` the output, so a captured graph
sees new scales.

A page id outside ``[0, num_pages)``, and a page of the tile past the split's end, is never
dereferenced: its copy is pointed past the end of the cache's row range, which TMA fills
with zeros without reading memory (the mbarrier still counts the box's bytes), and its
tokens' scores are -inf (per token: bit ``t // PAGE`` of the tile's validity bits, which
the consumers take from the tile's ids (``_tile_ids``, loaded a tile ahead, as the copy
warp loads them for its copies); a tile whose pages were all read and that ends before
every row's end scales its scores with no mask, a uniform branch). Rows of the last
(partial) tile past the split's end are zeroed in shared memory before the PV MMA (a
stale row must not turn ``0 * NaN`` into a NaN). The split of a request's tokens and the
partials layout (``[B, QLEN * H, splits, 512]`` fp32 partial outputs and
``[B, QLEN * H, splits]`` log2-sum-exp, row ``head * QLEN + token``) are those of the
Triton stage 1 with ``BLOCK_N = 64``, so the existing :func:`_decode_reduce` (with
``QLEN``) merges them.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kdispatch.dtypes import torch_dtype
from kdispatch.kernels._common import interpreting
from kdispatch.kernels.decode_attention.checks import q_dims, shares_latent
from kdispatch.kernels.decode_attention.spec import (GLUON_HEAD_DIMS, GLUON_KV_DTYPES,
                                                     GLUON_PAGE_SIZES, gluon_config)

#: the cache dtypes the tile takes (the dispatch key's ``GLUON_KV_DTYPES``)
GLUON_CACHE_DTYPES = tuple(torch_dtype(name) for name in GLUON_KV_DTYPES)

LOG2E = 1.4426950408889634
BLOCK_H = 64      # rows ((token, head) pairs of one request) per program
BLOCK_N = 64      # tokens per tile (the split chunking's unit)
DV = 512          # latent (V) columns
DPE = 64          # rope columns
NUM_WARPS = 8     # two warpgroups (and the copy warp, in a third warpgroup of its own)
#: registers a thread at launch: 12 warps (the copy warp's group rounds up to 4) x 32 x 168
#: fit the SM's 65,536; the copy warp's group then gives its registers up to 32 a thread
#: and the two warpgroups take what that frees (240)
MAXNREG = 168
COPY_WARP_REGS = 32


@gluon.jit
def _page_row(bt_row, n, end, pred, num_pages, oob_row, PAGE: gl.constexpr):
    """The cache row of the page holding token ``n`` and whether it is read (int32 0/1):
    ``oob_row`` (zeros, nothing read) and 0 for a page id outside ``[0, num_pages)`` or a
    token at or past ``end`` (or not ``pred``)."""
    pg = gl.load(bt_row + n // PAGE, mask=pred & (n < end), other=-1)
    valid = (pg >= 0) & (pg < num_pages)
    return gl.where(valid, pg * PAGE, oob_row), valid.to(gl.int32)


@gluon.jit
def _copy_page(kv_desc, pe_desc, kv_smem, pe_smem, bar, row, pred, st, j: gl.constexpr,
               BLOCK_N: gl.constexpr, PAGE: gl.constexpr):
    kv_dst = kv_smem.index(st)
    pe_dst = pe_smem.index(st)
    if PAGE < BLOCK_N:  # page j of the tile: rows j * PAGE of the stage's buffers
        kv_dst = kv_dst.slice(j * PAGE, PAGE, dim=0)
        pe_dst = pe_dst.slice(j * PAGE, PAGE, dim=0)
    tma.async_copy_global_to_shared(kv_desc, [row, 0], bar, kv_dst, pred=pred)
    tma.async_copy_global_to_shared(pe_desc, [row, 0], bar, pe_dst, pred=pred)


@gluon.jit
def _tile_ids(bt_row, n0, end, pred, num_pages, oob_row, BLOCK_N: gl.constexpr,
              PAGE: gl.constexpr):
    """The cache rows of the ``BLOCK_N // PAGE`` (1, 2 or 4) pages of the tile at token
    ``n0`` (unused ones repeat the first) and the tile's validity bits (int32, bit ``j``:
    page ``j`` is read, i.e. its id is in ``[0, num_pages)``, its first token before
    ``end`` and ``pred``): the scores' mask without reloading the ids. Loaded a tile ahead
    of their copies, so no copy waits on an id load."""
    NP: gl.constexpr = BLOCK_N // PAGE
    gl.static_assert(NP == 1 or NP == 2 or NP == 4)
    r0, bits = _page_row(bt_row, n0, end, pred, num_pages, oob_row, PAGE)
    r1 = r0
    r2 = r0
    r3 = r0
    if NP > 1:
        r1, v1 = _page_row(bt_row, n0 + PAGE, end, pred, num_pages, oob_row, PAGE)
        bits = bits | (v1 << 1)
    if NP > 2:
        r2, v2 = _page_row(bt_row, n0 + 2 * PAGE, end, pred, num_pages, oob_row, PAGE)
        r3, v3 = _page_row(bt_row, n0 + 3 * PAGE, end, pred, num_pages, oob_row, PAGE)
        bits = bits | (v2 << 2) | (v3 << 3)
    return r0, r1, r2, r3, bits


@gluon.jit
def _copy_tile(kv_desc, pe_desc, kv_smem, pe_smem, ready, r0, r1, r2, r3, pred, st,
               BLOCK_N: gl.constexpr, PAGE: gl.constexpr):
    """TMA copies of a tile's pages (cache rows ``r0..r3`` from :func:`_tile_ids`) into
    stage ``st`` (when ``pred``), all of them always (a page past the split's end or with a
    bad id reads as zeros and still counts its bytes): one constant byte count."""
    NP: gl.constexpr = BLOCK_N // PAGE
    bar = ready.index(st)
    mbarrier.expect(bar, NP * (kv_desc.block_type.nbytes + pe_desc.block_type.nbytes),
                    pred=pred)
    _copy_page(kv_desc, pe_desc, kv_smem, pe_smem, bar, r0, pred, st, 0, BLOCK_N, PAGE)
    if NP > 1:
        _copy_page(kv_desc, pe_desc, kv_smem, pe_smem, bar, r1, pred, st, 1, BLOCK_N, PAGE)
    if NP > 2:
        _copy_page(kv_desc, pe_desc, kv_smem, pe_smem, bar, r2, pred, st, 2, BLOCK_N, PAGE)
        _copy_page(kv_desc, pe_desc, kv_smem, pe_smem, bar, r3, pred, st, 3, BLOCK_N, PAGE)


@gluon.jit
def _q_to_f16(q_smem, ROWS: gl.constexpr, COLS: gl.constexpr, num_warps: gl.constexpr):
    """q's bf16 tile rewritten in place as fp16 (the fp8 latent's dots), saturating at
    +-65504; returns the fp16 view. Each thread stores the values it loaded."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    view = q_smem._reinterpret(gl.float16, [ROWS, COLS], q_smem.layout)
    for c in gl.static_range(COLS // 64):
        x = q_smem.slice(c * 64, 64, dim=1).load(layout).to(gl.float32)
        x = gl.minimum(gl.maximum(x, -65504.0), 65504.0)
        view.slice(c * 64, 64, dim=1).store(x.to(gl.float16))
    return view


@gluon.jit
def _f8_to_f16(src, dst, lim, ROWS: gl.constexpr, COLS: gl.constexpr,
               num_warps: gl.constexpr, MASK: gl.constexpr):
    """An fp8 (e4m3) tile in shared memory converted to ``dst`` (fp16, exact): 8 bytes a
    thread per row load (16 held 30 more registers: spills at the 64-row tile), packed
    ``cvt`` to fp16. With ``MASK`` the rows from ``lim`` on are zeros (a partial tile's V
    rows past the split's end: ``0 * NaN`` must not reach PV)."""
    W: gl.constexpr = 64 if COLS >= 64 else COLS
    TC: gl.constexpr = W // 8
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TC, TC], [num_warps, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    for c in gl.static_range(COLS // W):
        x = src.slice(c * W, W, dim=1).load(layout).to(gl.float16)
        if MASK:
            x = gl.where((rows < lim)[:, None], x, 0.0)
        dst.slice(c * W, W, dim=1).store(x)


@gluon.jit
def _mean_len(SL, max_len, batch, num_warps: gl.constexpr):
    """The batch's mean clamped length, rounded up (the Triton kernels' ``_mean_live``
    without a window)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    offs = gl.arange(0, 256, layout=layout)
    total = gl.zeros([256], gl.int64, layout=layout)
    for i in range(0, batch, 256):
        n = gl.load(SL + i + offs, mask=i + offs < batch, other=0)
        total += gl.minimum(gl.maximum(n, 0), max_len).to(gl.int64)
    return gl.cdiv(gl.sum(total, 0), batch).to(gl.int32)


@gluon.jit
def _producer(kv_desc, pe_desc, kv_smem, pe_smem, ready, empty, bt_row, start, end, n_tiles,
              num_pages, oob_row, BLOCK_N: gl.constexpr, PAGE: gl.constexpr):
    """The copy warp: each tile's page ids, then its TMA copies into the ring's stage once
    the consumers released it (``empty``); the copies complete ``ready``."""
    for i in range(n_tiles):
        st = i % 2
        r0, r1, r2, r3, bits = _tile_ids(bt_row, start + i * BLOCK_N, end, True, num_pages,
                                         oob_row, BLOCK_N, PAGE)
        # a fresh mbarrier's preceding phase counts as complete: the first two tiles pass
        mbarrier.wait(empty.index(st), ((i // 2) & 1) ^ 1)
        _copy_tile(kv_desc, pe_desc, kv_smem, pe_smem, ready, r0, r1, r2, r3, True, st,
                   BLOCK_N, PAGE)


@gluon.jit
def _consumer(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, kv16, pe16, ready, empty, q_bar,
              bt_row, start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, KS, VS,
              PO, PL, b, split, pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb,
              stride_plh, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, PAGE: gl.constexpr,
              DV: gl.constexpr, QLEN: gl.constexpr, KV_FP8: gl.constexpr,
              KV_SCALED: gl.constexpr, num_warps: gl.constexpr):
    """The two warpgroups' tile loop (scores, online softmax, PV) and the partials."""
    # scores: each warpgroup 32 of the 64 token columns; output: each 256 of the 512
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, DV // 2, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    zero_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    if KV_FP8:
        DOT: gl.constexpr = gl.float16
    else:
        DOT: gl.constexpr = gl.bfloat16

    # bits: the validity bits of the tile the loop step computes, loaded a tile ahead
    bits = _tile_ids(bt_row, start, end, n_tiles > 0, num_pages, oob_row, BLOCK_N, PAGE)[4]
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_s)
    # the row sums stay per element until the end: no cross-warpgroup sum per page
    l_2d = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    # an async MMA's result type from the start, as the loop carries it
    acc = warpgroup_mma_init(gl.zeros([BLOCK_H, DV], gl.float32, layout=o_layout))
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    offs_t = gl.arange(0, BLOCK_N, layout=col_s)
    if PAGE == BLOCK_N:  # one page a tile: bit 0 (a scalar test)
        page_bit: gl.constexpr = 1
    else:  # a token column's page's bit in ``bits`` ([1, BLOCK_N])
        page_bit = (1 << (offs_t // PAGE))[None, :]
    ALL_PAGES: gl.constexpr = (1 << (BLOCK_N // PAGE)) - 1  # every page of a tile read
    # a tile ending at or before ``clean_end`` with every page read needs no mask
    clean_end = end
    if QLEN > 1:  # each row's visible end: its token's causal limit, within the split
        tok_s = (pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)) // heads
        row_end = gl.minimum(seq_len - (QLEN - 1) + tok_s, end)
        clean_end = gl.minimum(seq_len - (QLEN - 1) + (pid_h * BLOCK_H) // heads, end)
    mbarrier.wait(q_bar, 0)
    if KV_FP8:  # q to fp16 in place (each thread rewrites the values it read)
        q_mma = _q_to_f16(q_smem, BLOCK_H, DV, num_warps)
        qpe_mma = _q_to_f16(qpe_smem, BLOCK_H, qpe_smem.shape[1], num_warps)
        fence_async_shared()
        gl.thread_barrier()
        if KV_SCALED:  # the dequantized latent (as K) = stored * k_scale
            qk_scale = qk_scale * gl.load(KS)
    else:
        q_mma = q_smem
        qpe_mma = qpe_smem

    for i in range(n_tiles):
        st = i % 2
        n0 = start + i * BLOCK_N
        if KV_FP8:
            kv = kv16
            pe = pe16
        else:
            kv = kv_smem.index(st)
            pe = pe_smem.index(st)
        # the next tile's bits (an id load or four, under this tile's wait and MMAs)
        bits_next = _tile_ids(bt_row, n0 + BLOCK_N, end, i + 1 < n_tiles, num_pages,
                              oob_row, BLOCK_N, PAGE)[4]
        mbarrier.wait(ready.index(st), (i // 2) & 1)
        if KV_FP8:  # the stage's fp8 bytes to the fp16 tile (the last tile's MMAs were
            # waited); the last, partial tile's V rows past the split's end as zeros
            if n0 + BLOCK_N > end:
                _f8_to_f16(kv_smem.index(st), kv16, end - n0, BLOCK_N, DV, num_warps, True)
            else:
                _f8_to_f16(kv_smem.index(st), kv16, BLOCK_N, BLOCK_N, DV, num_warps, False)
            _f8_to_f16(pe_smem.index(st), pe16, BLOCK_N, BLOCK_N, pe16.shape[1], num_warps,
                       False)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(empty.index(st), count=1)  # the stage is read: refill it
        elif n0 + BLOCK_N > end:  # the last, partial tile: zero V's rows past the split's end
            rows_z = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, zero_l))
            keep_z = (rows_z < end - n0)[:, None]
            for c in gl.static_range(DV // 64):
                part = kv.slice(c * 64, 64, dim=1)
                part.store(gl.where(keep_z, part.load(zero_l), 0.0))
            fence_async_shared()
            gl.thread_barrier()
        s = warpgroup_mma(qpe_mma, pe.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(q_mma, kv.permute((1, 0)), s, is_async=True)
        # waits this warpgroup's score MMA (its PV MMA was waited last tile)
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))

        if (bits == ALL_PAGES) & (n0 + BLOCK_N <= clean_end):  # (uniform) nothing masked
            s = s * qk_scale
        else:  # a token is seen when its page was read (the bits of its page ids) and it
            # is before its row's end
            page_ok = (bits & page_bit) != 0
            if QLEN > 1:  # a row's end is within the split's
                visible = ((n0 + offs_t)[None, :] < row_end[:, None]) & page_ok
            else:
                visible = (offs_t < end - n0)[None, :] & page_ok
            s = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        l_2d = l_2d * alpha[:, None] + p
        m_i = m_new
        p_smem.store(p.to(DOT))
        fence_async_shared()
        gl.thread_barrier()  # every warp's P is in shared memory before the MMA reads it
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        acc = warpgroup_mma(p_smem, kv, acc, is_async=True)
        # an accumulator in flight across the back edge makes ptxas serialize the wgmmas
        # (C7515, or C7514 when waited after the next score MMA); waiting here keeps each
        # chain pipelined
        acc = warpgroup_mma_init(warpgroup_mma_wait(num_outstanding=0, deps=(acc,)))
        gl.thread_barrier()  # both warpgroups' MMAs are done with the tile
        if not KV_FP8:  # the copy warp may refill the stage (fp8: the next tile's
            # conversion may overwrite the fp16 tile)
            mbarrier.arrive(empty.index(st), count=1)
        bits = bits_next

    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    l_i = gl.sum(l_2d, 1)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    if KV_SCALED:  # the dequantized latent (as V) = stored * v_scale
        out = acc * gl.convert_layout(gl.load(VS) / l_safe, row_o)[:, None]
    else:
        out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    # row r (token r // heads, head r % heads) goes to partial row head * QLEN + token
    has_work = n_tiles > 0
    rows_o = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_o)
    prow_o = rows_o
    if QLEN > 1:
        prow_o = (rows_o % heads) * QLEN + rows_o // heads
    cols_o = gl.arange(0, DV, layout=col_o)
    po = (PO + b * stride_pob + split * stride_pos + prow_o[:, None] * stride_poh
          + cols_o[None, :])
    gl.store(po, out, mask=has_work & (rows_o < QLEN * heads)[:, None]
             & (cols_o[None, :] < DV))
    rows_s = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
    prow_s = rows_s
    if QLEN > 1:
        prow_s = (rows_s % heads) * QLEN + rows_s // heads
    gl.store(PL + b * stride_plb + prow_s * stride_plh + split, m_i + gl.log2(l_safe),
             mask=has_work & (rows_s < QLEN * heads))


@gluon.jit
def _gluon_mla_stage1(
    q_desc, qpe_desc, kv_desc, pe_desc, BT, SL, PO, PL, KS, VS,
    qk_scale, max_len, num_pages, heads,
    stride_btb, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    NUM_KV_SPLITS: gl.constexpr, BLOCK_H: gl.constexpr, PAGE: gl.constexpr,
    DV: gl.constexpr, DPE: gl.constexpr, GRID_SPLITS: gl.constexpr, num_warps: gl.constexpr,
    QLEN: gl.constexpr = 1, BLOCK_N: gl.constexpr = 64, KV_FP8: gl.constexpr = False,
    KV_SCALED: gl.constexpr = False,
):
    gl.static_assert(num_warps == 8)
    gl.static_assert(BLOCK_H == 64)
    gl.static_assert(BLOCK_N == 64)
    gl.static_assert(BLOCK_N % PAGE == 0)
    pid_h = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    smem_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
    # the dots' dtype: bf16, or fp16 for an fp8 latent (e4m3 -> fp16 is one packed
    # conversion on sm_90; q's bf16 values convert exactly within fp16's range)
    if KV_FP8:
        DOT: gl.constexpr = gl.float16
    else:
        DOT: gl.constexpr = gl.bfloat16

    # the request's token range of this split: _split_range with BLOCK_N = 64 (from
    # seq_len: with QLEN > 1 the rows' own ends only mask), balanced as it is
    seq_len = gl.minimum(gl.maximum(gl.load(SL + b), 0), max_len)
    chunk = gl.maximum(gl.cdiv(gl.cdiv(seq_len, GRID_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    if GRID_SPLITS > NUM_KV_SPLITS:
        mean = _mean_len(SL, max_len, gl.num_programs(1), num_warps)
        chunk = gl.maximum(chunk, gl.cdiv(gl.cdiv(mean, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N)
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    n_tiles = gl.maximum(gl.cdiv(end - start, BLOCK_N), 0)
    if split > 0 and n_tiles == 0:  # an empty split: leaves before its TMA setup
        return
    bt_row = BT + b * stride_btb
    oob_row = num_pages * PAGE  # a copy from here on is all out of bounds: zeros, no read

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, DV], smem_l)
    qpe_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, DPE], smem_l)
    # the TMA ring: the cache's own dtype (bf16, or fp8 bytes converted per tile)
    kv_smem = gl.allocate_shared_memory(kv_desc.dtype, [2, BLOCK_N, DV], kv_desc.layout)
    pe_smem = gl.allocate_shared_memory(pe_desc.dtype, [2, BLOCK_N, DPE], pe_desc.layout)
    p_smem = gl.allocate_shared_memory(DOT, [BLOCK_H, BLOCK_N], smem_l)
    if KV_FP8:  # one fp16 tile both dots read, converted from the ring's stage per tile
        kv16 = gl.allocate_shared_memory(gl.float16, [BLOCK_N, DV], smem_l)
        pe16 = gl.allocate_shared_memory(gl.float16, [BLOCK_N, DPE], smem_l)
    else:  # (unused)
        kv16 = kv_smem
        pe16 = pe_smem
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=1)
    mbarrier.init(q_bar, count=1)
    fence_async_shared()

    # the request's rows are contiguous in q's row view: the box starts at its first row
    # plus the tile's (a box past the descriptor's end is zero-filled)
    q_row = b * (QLEN * heads) + pid_h * BLOCK_H
    mbarrier.expect(q_bar, BLOCK_H * (DV + DPE) * 2)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    tma.async_copy_global_to_shared(qpe_desc, [q_row, 0], q_bar, qpe_smem)

    gl.warp_specialize([
        (_consumer, (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, kv16, pe16, ready, empty,
                     q_bar, bt_row, start, end, n_tiles, seq_len, num_pages, oob_row,
                     qk_scale, KS, VS, PO, PL, b, split, pid_h, heads, stride_pob,
                     stride_poh, stride_pos, stride_plb, stride_plh, BLOCK_H, BLOCK_N, PAGE,
                     DV, QLEN, KV_FP8, KV_SCALED, num_warps)),
        (_producer, (kv_desc, pe_desc, kv_smem, pe_smem, ready, empty, bt_row, start, end,
                     n_tiles, num_pages, oob_row, BLOCK_N, PAGE)),
    ], [1], [32])  # COPY_WARP_REGS
    mbarrier.invalidate(q_bar)
    for j in gl.static_range(2):
        mbarrier.invalidate(ready.index(j))
        mbarrier.invalidate(empty.index(j))


def _smem_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


def _cache_layout(cache: torch.Tensor, cols: int, page: int):
    """The TMA ring's shared layout for a ``[page, cols]`` box of ``cache``'s dtype."""
    if cache.dtype == torch.bfloat16:
        return _smem_layout()
    return gl.NVMMASharedLayout.get_default_for([page, cols], gl.float8e4nv)


def q_rows_uniform(q) -> bool:
    """Whether q's ``B x QLEN x H`` rows are one 2-D view TMA can address: unit-stride
    columns, one 16-byte aligned row stride, rows in (request, token, head) order."""
    b, t, h, _ = q_dims(q)
    st = list(q.stride()) if q.dim() == 4 else [q.stride(0), 0, q.stride(1), q.stride(2)]
    rs = st[2]
    return (st[3] == 1 and rs % 8 == 0 and q.data_ptr() % 16 == 0
            and (t == 1 or st[1] == h * rs) and (b == 1 or st[0] == t * h * rs))


def descriptors(q, kv_cache):
    """(q latent, q rope, cache latent, cache rope) TMA descriptors over 2-D row views
    (q's rows: ``(b * QLEN + token) * H + head``), and the q they read."""
    b, t, h, d = q_dims(q)
    q2 = q if q_rows_uniform(q) else q.contiguous()
    q_rows, q_stride = b * t * h, q2.stride(-2)
    page = kv_cache.shape[1]
    rows, kstride = kv_cache.shape[0] * page, kv_cache.stride(1)
    lay = _smem_layout()
    # 1-D views over the rows' extent (rows may be padded: the row strides say how much)
    flat_q = q2.as_strided(((q_rows - 1) * q_stride + d,), (1,))
    flat_k = kv_cache.as_strided(((rows - 1) * kstride + d,), (1,))
    return (TensorDescriptor(flat_q, [q_rows, DV], [q_stride, 1], [BLOCK_H, DV], lay),
            TensorDescriptor(flat_q[DV:], [q_rows, DPE], [q_stride, 1], [BLOCK_H, DPE], lay),
            TensorDescriptor(flat_k, [rows, DV], [kstride, 1], [page, DV],
                             _cache_layout(kv_cache, DV, page)),
            TensorDescriptor(flat_k[DV:], [rows, DPE], [kstride, 1], [page, DPE],
                             _cache_layout(kv_cache, DPE, page)), q2)


def stage1_launch_args(q, kv_cache, block_table, seq_lens, scale, num_kv_splits, po, pl,
                       grid_splits=None, k_scale=None, v_scale=None):
    """(grid, positional args, constexpr kwargs) of the Gluon stage 1: grid
    ``(cdiv(QLEN * H, 64), B, grid_splits)``, partials ``po``
    ``[B, QLEN * H, grid_splits, 512]`` and ``pl`` ``[B, QLEN * H, grid_splits]`` (row
    ``head * QLEN + token``); ``grid_splits`` (default ``num_kv_splits``) above
    ``num_kv_splits`` balances ragged lengths. An fp8 latent (``KV_FP8``) is dequantized
    with ``k_scale`` / ``v_scale`` (one-element fp32 device tensors) when given."""
    grid_splits = grid_splits or num_kv_splits
    b, t, h, _ = q_dims(q)
    page = kv_cache.shape[1]
    qd, qpd, kd, ped, _ = descriptors(q, kv_cache)
    scaled = k_scale is not None
    args = (qd, qpd, kd, ped, block_table, seq_lens, po, pl,
            k_scale if scaled else seq_lens, v_scale if scaled else seq_lens,
            float(scale) * LOG2E,
            block_table.shape[1] * page, kv_cache.shape[0], h, block_table.stride(0),
            po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1))
    kw = {"NUM_KV_SPLITS": num_kv_splits, "BLOCK_H": BLOCK_H, "PAGE": page, "DV": DV,
          "DPE": DPE, "num_warps": NUM_WARPS, "QLEN": t, "BLOCK_N": BLOCK_N,
          "GRID_SPLITS": grid_splits, "KV_FP8": kv_cache.dtype == torch.float8_e4m3fn,
          "KV_SCALED": scaled}
    return (-(-(t * h) // BLOCK_H), b, grid_splits), args, kw


def gluon_call(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_table: torch.Tensor, seq_lens: torch.Tensor, sliding_window: Any,
               logit_cap: float, config: Any) -> bool:
    """Whether this call can run the Gluon stage 1 of ``config``: a GPU (not the
    interpreter), a bf16 q (3-D or 4-D) whose (request, token, head) rows share one row
    stride (TMA reads a tile's rows as one box), a bf16 or float8_e4m3fn latent of
    16/32/64-token pages whose 576-wide rows are contiguous, 16-byte aligned and packed
    page after page (TMA copies a page as one box), unit-stride block-table rows and
    lengths, no window, no logit cap, and the Gluon tile itself."""
    if interpreting() or not q.is_cuda or sliding_window is not None or logit_cap > 0:
        return False
    if config != gluon_config(int(config.num_kv_splits)):
        return False
    rows, page = k_cache.stride(1), k_cache.shape[1]
    return (q.dtype == torch.bfloat16 and k_cache.dtype in GLUON_CACHE_DTYPES
            and shares_latent(k_cache, v_cache) and q_rows_uniform(q)
            and page in GLUON_PAGE_SIZES and tuple(k_cache.shape[2:]) == (1, GLUON_HEAD_DIMS[0])
            and v_cache.shape[3] == GLUON_HEAD_DIMS[1] and k_cache.stride(3) == 1
            and k_cache.stride(0) == page * rows and rows * k_cache.element_size() % 16 == 0
            and k_cache.data_ptr() % 16 == 0 and k_cache.shape[0] * page < 2**31
            and block_table.stride(1) == 1 and seq_lens.stride(0) == 1)
