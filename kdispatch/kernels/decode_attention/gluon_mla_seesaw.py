"""The "seesaw" Gluon stage 1 for absorbed-MLA split-KV decode on sm_90 (prototype).

Same contract as :mod:`gluon_mla` (64 heads per program, 64-token bf16 pages, the
partials layout and split chunking of the Triton stage 1 with ``BLOCK_N = 64``), another
schedule (after FlashMLA's sm_90 kernel), in two warp-specialized warpgroups:

- warpgroup 0 (the default partition) computes the full 64 x 64 scores of the split's
  even pages, warpgroup 1 (a 4-warp worker partition) of its odd pages: each score MMA
  has N = 64 (not 32), and one warpgroup's softmax runs under the other's MMAs;
- the output's 512 columns stay split (warpgroup 0 columns 0-255, warpgroup 1 256-511),
  so each warpgroup accumulates P V of both pages of a pair: its own P from registers,
  the other's P from shared memory (``sP0``/``sP1``);
- one running row max is shared in shared memory and updated in turn (page 2j by
  warpgroup 0, then page 2j+1 by warpgroup 1 from it), with the rescale factors
  (``sScale0``/``sScale1``) passed on, so both halves of O and both P stay at one max;
- a page's stage holds it as two 256-column halves; the left half (V's columns 0-255)
  is only read by warpgroup 0 after the owner's score MMA, the right half and the rope
  columns only by warpgroup 1: each warpgroup refills its halves itself as soon as its
  own PV MMAs are done with them (no cross-warpgroup wait before a copy);
- every hand-over is an mbarrier (count 1, one arrive per warpgroup after a
  warpgroup barrier); q's rope columns live in registers (loaded once through ``sP0``),
  which frees the shared memory for the two P tiles.

A split with an odd page count runs one extra, all-zero page (its copy is pointed past
the cache: zeros, nothing read) whose scores are all masked. Bad page ids and the rows
past the length are handled as in :mod:`gluon_mla` (zero rows, -inf scores).
"""

from __future__ import annotations

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

HALF = 256  # the columns of one stage half (one warpgroup's share of V)
# barrier indices in the one barrier array: left / right half of stage 0 / 1 ready, max
# and scale of page 2j / 2j+1 ready, sP0 / sP1 written, sP0 / sP1 free, row sums, q
(RL0, RL1, RR0, RR1, S0, S1, P0, P1, F0, F1, L0, L1, QB) = (gl.constexpr(i)
                                                           for i in range(13))
NBAR = gl.constexpr(13)
# rows of the statistics array: running max, the two rescale factors, the two row sums
SM, SC0, SC1, SL0, SL1 = (gl.constexpr(i) for i in range(5))


@gluon.jit
def _page_row(bt_row, start, n, n_tiles, num_pages, oob_row, PAGE: gl.constexpr):
    pg = gl.load(bt_row + start // PAGE + n, mask=n < n_tiles, other=-1)
    return gl.where((pg >= 0) & (pg < num_pages), pg * PAGE, oob_row), pg


@gluon.jit
def _load_left(kv_desc, kv_smem, bars, bt_row, start, n, n_tiles, n_load, num_pages, oob_row,
               PAGE: gl.constexpr):
    """V columns 0-255 of page ``n`` into its stage (when ``n < n_load``)."""
    row, _ = _page_row(bt_row, start, n, n_tiles, num_pages, oob_row, PAGE)
    st = n % 2
    pred = n < n_load
    bar = bars.index(RL0 + st)
    mbarrier.expect(bar, kv_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(kv_desc, [row, 0], bar, kv_smem.index(2 * st), pred=pred)


@gluon.jit
def _load_right(kv_desc, pe_desc, kv_smem, pe_smem, bars, bt_row, start, n, n_tiles, n_load,
                num_pages, oob_row, PAGE: gl.constexpr, HALF: gl.constexpr):
    """V columns 256-511 and the rope columns of page ``n`` into its stage."""
    row, _ = _page_row(bt_row, start, n, n_tiles, num_pages, oob_row, PAGE)
    st = n % 2
    pred = n < n_load
    bar = bars.index(RR0 + st)
    mbarrier.expect(bar, kv_desc.block_type.nbytes + pe_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(kv_desc, [row, HALF], bar, kv_smem.index(2 * st + 1),
                                    pred=pred)
    tma.async_copy_global_to_shared(pe_desc, [row, 0], bar, pe_smem.index(st), pred=pred)


@gluon.jit
def _zero_tail(half, keep_rows, PAGE: gl.constexpr, HALF: gl.constexpr):
    """Zero a 64 x 256 half's rows from ``keep_rows`` on (a stale row may hold NaN)."""
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, PAGE, layout=gl.SliceLayout(1, zl))
    keep = (rows < keep_rows)[:, None]
    for c in gl.static_range(HALF // 64):
        part = half.slice(c * 64, 64, dim=1)
        part.store(gl.where(keep, part.load(zl), 0.0))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _scores(q_smem, qpe, kv_smem, pe_smem, bars, st, phase, n0, end, ok, qk_scale,
            PAGE: gl.constexpr, HALF: gl.constexpr):
    """The page's 64 x 64 scores (log2 units, masked) by this warpgroup alone."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, PAGE, 16])
    zero = gl.zeros([64, PAGE], gl.float32, layout=s_layout)
    mbarrier.wait(bars.index(RL0 + st), phase)
    s = warpgroup_mma(q_smem.index(0), kv_smem.index(2 * st).permute((1, 0)), zero,
                      use_acc=False, is_async=True)
    mbarrier.wait(bars.index(RR0 + st), phase)
    s = warpgroup_mma(q_smem.index(1), kv_smem.index(2 * st + 1).permute((1, 0)), s,
                      is_async=True)
    s = warpgroup_mma(qpe, pe_smem.index(st).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    offs_t = gl.arange(0, PAGE, layout=gl.SliceLayout(0, s_layout))
    visible = ((n0 + offs_t) < end) & ok
    return gl.where(visible[None, :], s * qk_scale, float("-inf"))


@gluon.jit
def _finish(acc, l_mine, stats, bars, MY_L: gl.constexpr, OTHER_L: gl.constexpr,
            PO, PL, b, split, pid_h, heads, has_work, col0,
            stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, WRITE_LSE: gl.constexpr,
            HALF: gl.constexpr):
    """Both row sums, then this warpgroup's 256 output columns (and warpgroup 0 the LSE)."""
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    stats.slice((SL0 + MY_L) * 64, 64).store(l_mine)
    gl.thread_barrier()
    mbarrier.arrive(bars.index(L0 + MY_L))
    mbarrier.wait(bars.index(L0 + OTHER_L), 0)
    l_i = l_mine + stats.slice((SL0 + OTHER_L) * 64, 64).load(l_mine.type.layout)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    rows_o = pid_h * 64 + gl.arange(0, 64, layout=row_o)
    cols_o = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
    po = (PO + b * stride_pob + split * stride_pos + rows_o[:, None] * stride_poh
          + cols_o[None, :])
    gl.store(po, out, mask=has_work & (cols_o[None, :] < col0 + HALF))
    if WRITE_LSE:
        m_fin = stats.slice((SM) * 64, 64).load(l_mine.type.layout)
        rows_s = pid_h * 64 + gl.arange(0, 64, layout=l_mine.type.layout)
        gl.store(PL + b * stride_plb + rows_s * stride_plh + split, m_fin + gl.log2(l_safe),
                 mask=has_work & (rows_s < heads))


@gluon.jit
def _wg0(q_smem, kv_smem, pe_smem, p_smem, stats, bars, kv_desc, bt_row, start, end,
         n_tiles, n_pairs, num_pages, oob_row, qk_scale, PO, PL, b, split, pid_h, heads,
         stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
         PAGE: gl.constexpr, HALF: gl.constexpr):
    """Even pages' scores and softmax; output columns 0-255; refills the left halves."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, PAGE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    n_load = 2 * n_pairs
    mbarrier.wait(bars.index(QB), 0)
    qpe = p_smem.index(0).load(gl.DotOperandLayout(operand_index=0, parent=s_layout,
                                                   k_width=2))
    acc = gl.zeros([64, HALF], gl.float32, layout=o_layout)
    l_i = gl.zeros([64], gl.float32, layout=row_s)
    for j in range(n_pairs):
        ph = j & 1
        ne = 2 * j
        n0 = start + ne * PAGE
        pg = gl.load(bt_row + start // PAGE + ne)
        s = _scores(q_smem, qpe, kv_smem, pe_smem, bars, 0, ph, n0, end,
                    (pg >= 0) & (pg < num_pages), qk_scale, PAGE, HALF)
        # the running max after page 2j: sM was last written by warpgroup 1 (waited below)
        m_old = stats.slice((SM) * 64, 64).load(row_s)
        m_new = gl.maximum(m_old, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        scale0 = gl.exp2(m_old - m_use)
        p = gl.exp2(s - m_use[:, None])
        l_i = l_i * scale0 + gl.sum(p, 1)
        pb = p.to(gl.bfloat16)  # kept as bf16 (registers): rescaled below in fp32
        stats.slice((SM) * 64, 64).store(m_new)
        stats.slice((SC0) * 64, 64).store(scale0)
        gl.thread_barrier()
        mbarrier.arrive(bars.index(S0))
        if n0 + PAGE > end:  # the last, partial page: zero V's stale rows (left half)
            _zero_tail(kv_smem.index(0), end - n0, PAGE, HALF)
        acc = acc * gl.convert_layout(scale0, row_o)[:, None]
        pv = warpgroup_mma(gl.convert_layout(pb, p_op), kv_smem.index(0), acc, is_async=True)
        # warpgroup 1's max after page 2j+1: rescale P0 to it and hand it over
        mbarrier.wait(bars.index(S1), ph)
        scale1 = stats.slice((SC1) * 64, 64).load(row_s)
        mbarrier.wait(bars.index(F0), ph)  # warpgroup 1 is done with the last sP0
        p_smem.index(0).store((pb.to(gl.float32) * scale1[:, None]).to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bars.index(P0))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
        _load_left(kv_desc, kv_smem, bars, bt_row, start, ne + 2, n_tiles, n_load, num_pages,
                   oob_row, PAGE)
        acc = acc * gl.convert_layout(scale1, row_o)[:, None]
        l_i = l_i * scale1
        # page 2j+1's left half with warpgroup 1's P
        no = ne + 1
        mbarrier.wait(bars.index(RL1), ph)
        mbarrier.wait(bars.index(P1), ph)  # (warpgroup 1's score MMA is done with it)
        if start + no * PAGE + PAGE > end:
            _zero_tail(kv_smem.index(2), end - start - no * PAGE, PAGE, HALF)
        pv = warpgroup_mma(p_smem.index(1), kv_smem.index(2), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
        gl.thread_barrier()
        mbarrier.arrive(bars.index(F1))
        _load_left(kv_desc, kv_smem, bars, bt_row, start, no + 2, n_tiles, n_load, num_pages,
                   oob_row, PAGE)
    _finish(acc, l_i, stats, bars, 0, 1, PO, PL, b, split, pid_h, heads, n_tiles > 0, 0,
            stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, True, HALF)


@gluon.jit
def _wg1(q_smem, kv_smem, pe_smem, p_smem, stats, bars, kv_desc, pe_desc, bt_row, start, end,
         n_tiles, n_pairs, num_pages, oob_row, qk_scale, PO, PL, b, split, pid_h, heads,
         stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
         PAGE: gl.constexpr, HALF: gl.constexpr):
    """Odd pages' scores and softmax; output columns 256-511; refills the right halves."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, PAGE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    n_load = 2 * n_pairs
    mbarrier.wait(bars.index(QB), 0)
    qpe = p_smem.index(0).load(gl.DotOperandLayout(operand_index=0, parent=s_layout,
                                                   k_width=2))
    acc = gl.zeros([64, HALF], gl.float32, layout=o_layout)
    l_i = gl.zeros([64], gl.float32, layout=row_s)
    for j in range(n_pairs):
        ph = j & 1
        ne = 2 * j
        no = ne + 1
        n0 = start + no * PAGE
        pg = gl.load(bt_row + start // PAGE + no, mask=no < n_tiles, other=-1)
        s = _scores(q_smem, qpe, kv_smem, pe_smem, bars, 1, ph, n0, end,
                    (pg >= 0) & (pg < num_pages), qk_scale, PAGE, HALF)
        r = gl.max(s, 1)
        mbarrier.wait(bars.index(S0), ph)  # warpgroup 0's max after page 2j
        m_old = stats.slice((SM) * 64, 64).load(row_s)
        scale0 = stats.slice((SC0) * 64, 64).load(row_s)
        m_new = gl.maximum(m_old, r)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        scale1 = gl.exp2(m_old - m_use)
        p = gl.exp2(s - m_use[:, None])
        stats.slice((SM) * 64, 64).store(m_new)
        stats.slice((SC1) * 64, 64).store(scale1)
        gl.thread_barrier()
        mbarrier.arrive(bars.index(S1))
        c = scale0 * scale1
        l_i = l_i * c + gl.sum(p, 1)
        pb = p.to(gl.bfloat16)
        mbarrier.wait(bars.index(F1), ph)  # warpgroup 0 is done with the last sP1
        p_smem.index(1).store(pb)
        fence_async_shared()
        if n0 + PAGE > end:  # zero the right half's stale rows (its own page)
            _zero_tail(kv_smem.index(3), end - n0, PAGE, HALF)
        gl.thread_barrier()
        mbarrier.arrive(bars.index(P1))
        acc = acc * gl.convert_layout(c, row_o)[:, None]
        pv = warpgroup_mma(gl.convert_layout(pb, p_op), kv_smem.index(3), acc, is_async=True)
        # page 2j's right half with warpgroup 0's P (already at this max)
        mbarrier.wait(bars.index(RR0), ph)
        if start + ne * PAGE + PAGE > end:
            _zero_tail(kv_smem.index(1), end - start - ne * PAGE, PAGE, HALF)
        mbarrier.wait(bars.index(P0), ph)
        pv = warpgroup_mma(p_smem.index(0), kv_smem.index(1), pv, is_async=True)
        pv = warpgroup_mma_wait(num_outstanding=1, deps=(pv,))
        _load_right(kv_desc, pe_desc, kv_smem, pe_smem, bars, bt_row, start, no + 2, n_tiles,
                    n_load, num_pages, oob_row, PAGE, HALF)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
        gl.thread_barrier()
        mbarrier.arrive(bars.index(F0))
        _load_right(kv_desc, pe_desc, kv_smem, pe_smem, bars, bt_row, start, ne + 2, n_tiles,
                    n_load, num_pages, oob_row, PAGE, HALF)
    _finish(acc, l_i, stats, bars, 1, 0, PO, PL, b, split, pid_h, heads, n_tiles > 0, HALF,
            stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, False, HALF)


@gluon.jit
def _gluon_mla_stage1_seesaw(
    q_desc, qpe_desc, kv_desc, pe_desc, BT, SL, PO, PL,
    qk_scale, max_len, num_pages, heads,
    stride_btb, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    NUM_KV_SPLITS: gl.constexpr, PAGE: gl.constexpr, HALF: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4)  # warpgroup 0; warpgroup 1 is the worker partition
    pid_h = gl.program_id(0)
    split = gl.program_id(1)
    b = gl.program_id(2)
    seq_len = gl.minimum(gl.maximum(gl.load(SL + b), 0), max_len)
    chunk = gl.maximum(gl.cdiv(gl.cdiv(seq_len, NUM_KV_SPLITS), PAGE) * PAGE, PAGE)
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    n_tiles = gl.maximum(gl.cdiv(end - start, PAGE), 0)
    n_pairs = (n_tiles + 1) // 2
    bt_row = BT + b * stride_btb
    oob_row = num_pages * PAGE

    smem_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 64, HALF], smem_l)
    # [stage 0 left, stage 0 right, stage 1 left, stage 1 right]
    kv_smem = gl.allocate_shared_memory(gl.bfloat16, [4, PAGE, HALF], smem_l)
    pe_smem = gl.allocate_shared_memory(gl.bfloat16, [2, PAGE, 64], smem_l)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 64, PAGE], smem_l)
    stats = gl.allocate_shared_memory(
        gl.float32, [8 * 64], gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                      order=[0]))
    bars = gl.allocate_shared_memory(gl.int64, [NBAR, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBAR):
        mbarrier.init(bars.index(i), count=1)
    init_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    stats.slice((SM) * 64, 64).store(gl.full([64], float("-inf"), gl.float32, layout=init_l))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(bars.index(F0))  # both P tiles start free
    mbarrier.arrive(bars.index(F1))

    q_row = b * heads + pid_h * 64
    qb = bars.index(QB)
    mbarrier.expect(qb, 2 * q_desc.block_type.nbytes + qpe_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], qb, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row, HALF], qb, q_smem.index(1))
    tma.async_copy_global_to_shared(qpe_desc, [q_row, 0], qb, p_smem.index(0))
    n_load = 2 * n_pairs
    for n in gl.static_range(2):
        _load_left(kv_desc, kv_smem, bars, bt_row, start, n, n_tiles, n_load, num_pages,
                   oob_row, PAGE)
        _load_right(kv_desc, pe_desc, kv_smem, pe_smem, bars, bt_row, start, n, n_tiles,
                    n_load, num_pages, oob_row, PAGE, HALF)

    gl.warp_specialize([
        (_wg0, (q_smem, kv_smem, pe_smem, p_smem, stats, bars, kv_desc, bt_row, start, end,
                n_tiles, n_pairs, num_pages, oob_row, qk_scale, PO, PL, b, split, pid_h,
                heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, PAGE,
                HALF)),
        (_wg1, (q_smem, kv_smem, pe_smem, p_smem, stats, bars, kv_desc, pe_desc, bt_row,
                start, end, n_tiles, n_pairs, num_pages, oob_row, qk_scale, PO, PL, b, split,
                pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
                PAGE, HALF)),
    ], [4], [256])

