"""Device pieces the Gluon MLA stage 1's partitions share (``gluon_mla``): a tile's page
ids and validity bits, its TMA copies and the copy warp that issues them, the fp8 latent's
conversions to fp16, the batch's mean length, a partial tile's zeroed V rows, the scores'
mask and online softmax step, and the partials' store."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

BLOCK_H = 64      # rows ((token, head) pairs of one request) per program
BLOCK_N = 64      # tokens per tile (the split chunking's unit)
DV = 512          # latent (V) columns
DPE = 64          # rope columns


@gluon.jit
def _page_row(bt_row, n, end, pred, num_pages, oob_row, PAGE: gl.constexpr):
    """The cache row of token ``n`` (its page's row plus its offset in the page) and whether
    it is read (int32 0/1): ``oob_row`` (zeros, nothing read) and 0 for a page id outside
    ``[0, num_pages)`` or a token at or past ``end`` (or not ``pred``)."""
    pg = gl.load(bt_row + n // PAGE, mask=pred & (n < end), other=-1)
    valid = (pg >= 0) & (pg < num_pages)
    return gl.where(valid, pg * PAGE + n % PAGE, oob_row), valid.to(gl.int32)


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
    """The cache rows of the ``BLOCK_N // PAGE`` (1, 2 or 4; 1 for a tile within a page)
    pages of the tile at token ``n0`` (unused ones repeat the first) and the tile's validity
    bits (int32, bit ``j``: page ``j`` is read, i.e. its id is in ``[0, num_pages)``, its
    first token before ``end`` and ``pred``): the scores' mask without reloading the ids.
    Loaded a tile ahead of their copies, so no copy waits on an id load."""
    NP: gl.constexpr = BLOCK_N // PAGE if PAGE < BLOCK_N else 1
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
    NP: gl.constexpr = BLOCK_N // PAGE if PAGE < BLOCK_N else 1
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
              num_pages, oob_row, TILE: gl.constexpr, PAGE: gl.constexpr,
              STAGES: gl.constexpr, g=0):
    """The copy warp: each tile's page ids, then its TMA copies into the ring's stage once
    the consumers released it (``empty``); the copies complete ``ready``. ``g``: the tiles
    the ring took before (earlier segments)."""
    for i in range(n_tiles):
        st = (g + i) % STAGES
        r0, r1, r2, r3, bits = _tile_ids(bt_row, start + i * TILE, end, True, num_pages,
                                         oob_row, TILE, PAGE)
        # a fresh mbarrier's preceding phase counts as complete: the first lap passes
        mbarrier.wait(empty.index(st), (((g + i) // STAGES) & 1) ^ 1)
        _copy_tile(kv_desc, pe_desc, kv_smem, pe_smem, ready, r0, r1, r2, r3, True, st,
                   TILE, PAGE)


@gluon.jit
def _plan_producer(kv_desc, pe_desc, q_desc, qpe_desc, kv_smem, pe_smem, q_smem, qpe_smem,
                   ready, empty, q_bar, q_free, bt_row, start, end, n_tiles, num_pages,
                   oob_row, pid_h, heads, WP, SL, BT, stride_btb, max_len, seg0, n_seg,
                   TILE: gl.constexpr, PAGE: gl.constexpr, STAGES: gl.constexpr,
                   BLOCK_H: gl.constexpr, QLEN: gl.constexpr, PLAN: gl.constexpr):
    """The copy warp of the form with both warpgroups on each tile over its program's work:
    the split's tiles, or (``PLAN``) each segment's q and tiles (work_plan.py)."""
    if PLAN:
        g = n_seg * 0
        for k in range(n_seg):
            b, start, end, seq_len, n_tiles, bt_row = _segment(WP, SL, BT, stride_btb, max_len,
                                                               seg0 + k, TILE)
            _load_q(q_desc, qpe_desc, q_smem, qpe_smem, q_bar, q_free, k, b, pid_h, heads,
                    BLOCK_H, QLEN)
            _producer(kv_desc, pe_desc, kv_smem, pe_smem, ready, empty, bt_row, start, end,
                      n_tiles, num_pages, oob_row, TILE, PAGE, STAGES, g)
            g += n_tiles
    else:
        _producer(kv_desc, pe_desc, kv_smem, pe_smem, ready, empty, bt_row, start, end,
                  n_tiles, num_pages, oob_row, TILE, PAGE, STAGES)


@gluon.jit
def _segment(WP, SL, BT, stride_btb, max_len, slot, TILE: gl.constexpr):
    """A work plan's segment at ``slot`` (work_plan.py): its request ``b``, tokens
    ``[start, end)``, the request's clamped length, the segment's tiles and the request's
    block-table row."""
    b = gl.load(WP + slot * 3)
    start = gl.load(WP + slot * 3 + 1)
    end = gl.load(WP + slot * 3 + 2)
    seq_len = gl.minimum(gl.maximum(gl.load(SL + b), 0), max_len)
    n_tiles = gl.maximum(gl.cdiv(end - start, TILE), 0)
    return b, start, end, seq_len, n_tiles, BT + b * stride_btb


@gluon.jit
def _load_q(q_desc, qpe_desc, q_smem, qpe_smem, q_bar, q_free, k, b, pid_h, heads,
            BLOCK_H: gl.constexpr, QLEN: gl.constexpr):
    """Segment ``k``'s q (its request's rows of the program's row block) by TMA, once the
    warpgroups freed the previous segment's (``q_free``; the first passes)."""
    mbarrier.wait(q_free, (k - 1) & 1, pred=k > 0)
    q_row = b * (QLEN * heads) + pid_h * BLOCK_H
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + qpe_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    tma.async_copy_global_to_shared(qpe_desc, [q_row, 0], q_bar, qpe_smem)


@gluon.jit
def _free_q(q_free, last):
    """A warpgroup's last score MMA of its segment is done (every warp's): the copy warp
    may load the next segment's q."""
    if last:
        gl.thread_barrier()
        mbarrier.arrive(q_free, count=1)


@gluon.jit
def _zero_tail(kv, lim, zero_l: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr):
    """A partial tile's V rows from ``lim`` on as zeros in shared memory (a stale row must
    not turn ``0 * NaN`` into a NaN in PV), fenced and behind a barrier."""
    rows_z = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, zero_l))
    keep_z = (rows_z < lim)[:, None]
    for c in gl.static_range(DV // 64):
        part = kv.slice(c * 64, 64, dim=1)
        part.store(gl.where(keep_z, part.load(zero_l), 0.0))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _masked_scores(s, bits, n0, qk_scale, clean_end, end, row_end, offs_t, page_bit,
                   TILE: gl.constexpr, PAGE: gl.constexpr, QLEN: gl.constexpr):
    """A tile's scores (from token ``n0``) scaled to log2 units, ``-inf`` where not seen: a
    token is seen when its page was read (the bits of its page ids) and it is before its
    row's end. A tile with every page read that ends before every row's end (uniform) is
    only scaled."""
    ALL_PAGES: gl.constexpr = (1 << (TILE // PAGE if PAGE < TILE else 1)) - 1
    if (bits == ALL_PAGES) & (n0 + TILE <= clean_end):
        s = s * qk_scale
    else:
        page_ok = (bits & page_bit) != 0
        if QLEN > 1:  # a row's end is within the split's
            visible = ((n0 + offs_t)[None, :] < row_end[:, None]) & page_ok
        else:
            visible = (offs_t < end - n0)[None, :] & page_ok
        s = gl.where(visible, s * qk_scale, float("-inf"))
    return s


@gluon.jit
def _softmax(s, bits, n0, m_i, l_2d, qk_scale, clean_end, end, row_end, offs_t, page_bit,
             BLOCK_N: gl.constexpr, PAGE: gl.constexpr, QLEN: gl.constexpr):
    """One tile's scores (from token ``n0``) to ``P`` (fp32, log2 units) with the online
    softmax's new row max, rescale factor and per-element row sums."""
    s = _masked_scores(s, bits, n0, qk_scale, clean_end, end, row_end, offs_t, page_bit,
                       BLOCK_N, PAGE, QLEN)
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_2d * alpha[:, None] + p


@gluon.jit
def _store_partials(out, lse, STORE_LSE: gl.constexpr, col0, has_work, PO, PL, b, split,
                    pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
                    row_s: gl.constexpr, row_o: gl.constexpr, col_o: gl.constexpr,
                    BLOCK_H: gl.constexpr, COLS: gl.constexpr, DV: gl.constexpr,
                    QLEN: gl.constexpr):
    """The program's partial outputs ``out`` (64 rows x ``COLS`` columns from ``col0``) and,
    with ``STORE_LSE``, its log2-sum-exp ``lse``: row ``r`` (token ``r // heads``, head
    ``r % heads``) goes to partial row ``head * QLEN + token``."""
    rows_o = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_o)
    prow_o = rows_o
    if QLEN > 1:
        prow_o = (rows_o % heads) * QLEN + rows_o // heads
    cols_o = col0 + gl.arange(0, COLS, layout=col_o)
    po = (PO + b * stride_pob + split * stride_pos + prow_o[:, None] * stride_poh
          + cols_o[None, :])
    gl.store(po, out, mask=has_work & (rows_o < QLEN * heads)[:, None]
             & (cols_o[None, :] < DV))
    if STORE_LSE:
        rows_s = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
        prow_s = rows_s
        if QLEN > 1:
            prow_s = (rows_s % heads) * QLEN + rows_s // heads
        gl.store(PL + b * stride_plb + prow_s * stride_plh + split, lse,
                 mask=has_work & (rows_s < QLEN * heads))
