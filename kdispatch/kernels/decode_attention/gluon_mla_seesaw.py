"""The Gluon MLA stage 1's seesaw (``gluon_mla``; bf16 latents in 64-token pages): two
4-warp warpgroups, each scoring every other 64-token tile with 64 x 64 score MMAs (one
warpgroup's operand reads per tile where both warpgroups' 32-column halves read q twice)
and holding half of the output's columns, with one warpgroup's softmax under the other's
MMAs."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# the tile's geometry. The kernels take it as parameters of these names; the code hash
# (kdispatch/source_hash.py) records the value of any module constant a kernel names, so
# the constants stay visible here as in the one module the H200 table was tuned on
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (  # noqa: F401
    BLOCK_H, BLOCK_N, DV)
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (_masked_scores,
                                                                _store_partials, _tile_ids,
                                                                _zero_tail)


@gluon.jit
def _seesaw_scores(q_smem, qpe_smem, kv, pe, s_layout: gl.constexpr, BLOCK_H: gl.constexpr,
                   TILE: gl.constexpr):
    """A warpgroup's score MMA of a whole tile (64 rows x ``TILE`` tokens), in flight."""
    s_zero = gl.zeros([BLOCK_H, TILE], gl.float32, layout=s_layout)
    s = warpgroup_mma(qpe_smem, pe.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_smem, kv.permute((1, 0)), s, is_async=True)


@gluon.jit
def _seesaw_wg(ME: gl.constexpr, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem,
               l_smem, ready, empty, pa_ready, pb_ready, pa_done, pb_done, sa_done, fin_bar,
               q_bar, bt_row, start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO,
               PL, b, split, pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb,
               stride_plh, BLOCK_H: gl.constexpr, TILE: gl.constexpr, PAGE: gl.constexpr,
               DV: gl.constexpr, QLEN: gl.constexpr):
    """Warpgroup ``ME`` (0 or 1) of the bf16 seesaw. Tiles go in pairs (A = 2j in stage 0,
    B = 2j + 1 in stage 1); warpgroup 0 scores A and holds O's left 256 columns, warpgroup
    1 scores B and holds the right ones. Per pair: warpgroup 0's score MMA of A; warpgroup
    1's of B (issued once A's is done: ``sa_done``) runs under warpgroup 0's softmax of A;
    A's P and row max go to warpgroup 1 through shared memory (``pa_ready``); both
    warpgroups' PV MMAs of A run under warpgroup 1's softmax of B (its max taken over
    A's), and each warpgroup then releases A's stage (the copy warp refills it while B is
    finished: ``empty`` counts one release from each warpgroup); once both have read A's P
    (``pa_done``), B's P and max take the one P buffer (``pb_ready``), both PV MMAs of B
    follow, and both release B's stage and the buffer (``pb_done``). Without B (an odd
    tile count's last pair) warpgroup 1 scores a stage no copy fills and masks every
    score. The row sums stay per warpgroup (each of the P it computed) until the end
    (``fin_bar``)."""
    HALF: gl.constexpr = DV // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    vec_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    zero_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    NEG: gl.constexpr = float("-inf")

    m_old = gl.full([BLOCK_H], NEG, gl.float32, layout=row_s)
    l_me = gl.zeros([BLOCK_H], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    offs_t = gl.arange(0, TILE, layout=col_s)
    if PAGE >= TILE:  # the tile is within one page: bit 0
        page_bit: gl.constexpr = 1
    else:
        page_bit = (1 << (offs_t // PAGE))[None, :]
    clean_end = end
    row_end = end
    if QLEN > 1:  # each row's visible end: its token's causal limit, within the split
        tok_s = (pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)) // heads
        row_end = gl.minimum(seq_len - (QLEN - 1) + tok_s, end)
        clean_end = gl.minimum(seq_len - (QLEN - 1) + (pid_h * BLOCK_H) // heads, end)
    m_a_smem = m_smem.slice(0, BLOCK_H)
    m_b_smem = m_smem.slice(BLOCK_H, BLOCK_H)
    mbarrier.wait(q_bar, 0)

    for j in range(gl.cdiv(n_tiles, 2)):
        ph = j & 1
        n_a = start + 2 * j * TILE
        n_b = n_a + TILE
        has_b = 2 * j + 1 < n_tiles
        # A's stage is 0 and B's 1, written as values the compiler cannot fold (n_a >= 0):
        # with constant stages it derives every MMA descriptor of both stages (60 64-bit
        # values) before the loop and spills them; now each is formed where it is used
        st_a = (n_a >> 31) & 1
        kv_a = kv_smem.index(st_a)
        kv_b = kv_smem.index(1 - st_a)
        pe_a = pe_smem.index(st_a)
        pe_b = pe_smem.index(1 - st_a)
        if ME == 0:
            bits = _tile_ids(bt_row, n_a, end, True, num_pages, oob_row, TILE, PAGE)[4]
            mbarrier.wait(ready.index(0), ph)
            if n_a + TILE > end:  # the split's last, partial tile
                _zero_tail(kv_a, end - n_a, zero_l, TILE, DV)
            s = _seesaw_scores(q_smem, qpe_smem, kv_a, pe_a, s_layout,
                               BLOCK_H, TILE)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            mbarrier.arrive(sa_done, count=1)  # warpgroup 1's score MMA may start
            s = _masked_scores(s, bits, n_a, qk_scale, clean_end, end, row_end, offs_t,
                               page_bit, TILE, PAGE, QLEN)
            m_a = gl.maximum(m_old, gl.max(s, 1))
            m_a_use = gl.where(m_a == NEG, 0.0, m_a)
            alpha = gl.exp2(m_old - m_a_use)
            p = gl.exp2(s - m_a_use[:, None])
            l_me = l_me * alpha + gl.sum(p, 1)
            mbarrier.wait(pb_done, ph)  # both warpgroups have read the last pair's P of B
            p_smem.store(p.to(gl.bfloat16))
            m_a_smem.store(gl.convert_layout(m_a, vec_l))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(pa_ready, count=1)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            acc = warpgroup_mma(p_smem, kv_a.slice(0, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()  # the warpgroup's MMA is done with A's P and stage
            mbarrier.arrive(pa_done, count=1)
            mbarrier.arrive(empty.index(0), count=1)
            mbarrier.wait(pb_ready, ph)  # B's P and the pair's row max
            m_b = gl.convert_layout(m_b_smem.load(vec_l), row_s)
            beta = gl.exp2(m_a_use - gl.where(m_b == NEG, 0.0, m_b))
            l_me = l_me * beta
            acc = acc * gl.convert_layout(beta, row_o)[:, None]
            if has_b:
                acc = warpgroup_mma(p_smem, kv_b.slice(0, HALF, dim=1), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        else:
            bits = _tile_ids(bt_row, n_b, end, has_b, num_pages, oob_row, TILE, PAGE)[4]
            if has_b:
                mbarrier.wait(ready.index(1), ph)
                if n_b + TILE > end:
                    _zero_tail(kv_b, end - n_b, zero_l, TILE, DV)
            # staggered: B's score MMA runs under warpgroup 0's softmax of A (without B,
            # it reads a stage no copy fills and every score is masked)
            mbarrier.wait(sa_done, ph)
            s = _seesaw_scores(q_smem, qpe_smem, kv_b, pe_b, s_layout,
                               BLOCK_H, TILE)
            mbarrier.wait(pa_ready, ph)  # A's P and row max
            m_a = gl.convert_layout(m_a_smem.load(vec_l), row_s)
            m_a_use = gl.where(m_a == NEG, 0.0, m_a)
            acc = acc * gl.convert_layout(gl.exp2(m_old - m_a_use), row_o)[:, None]
            acc = warpgroup_mma(p_smem, kv_a.slice(HALF, HALF, dim=1), acc, is_async=True)
            # B's scores (issued before A's PV MMA) are done; the PV MMA may still run
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            s = _masked_scores(s, bits, n_b, qk_scale, clean_end, end, row_end, offs_t,
                               page_bit, TILE, PAGE, QLEN)
            m_b = gl.maximum(m_a, gl.max(s, 1))
            m_b_use = gl.where(m_b == NEG, 0.0, m_b)
            p = gl.exp2(s - m_b_use[:, None])
            l_me = l_me * gl.exp2(m_old - m_b_use) + gl.sum(p, 1)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()  # the warpgroup's MMA is done with A's P and stage
            mbarrier.arrive(pa_done, count=1)
            mbarrier.arrive(empty.index(0), count=1)
            mbarrier.wait(pa_done, ph)  # warpgroup 0's MMA is done with A's P as well
            p_smem.store(p.to(gl.bfloat16))
            m_b_smem.store(gl.convert_layout(m_b, vec_l))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(pb_ready, count=1)
            acc = acc * gl.convert_layout(gl.exp2(m_a_use - m_b_use), row_o)[:, None]
            if has_b:
                acc = warpgroup_mma(p_smem, kv_b.slice(HALF, HALF, dim=1), acc,
                                    is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()  # the warpgroup's MMAs are done with B's P and stage
        mbarrier.arrive(pb_done, count=1)
        if has_b:
            mbarrier.arrive(empty.index(1), count=1)
        m_old = m_b

    # the row sums: each warpgroup's own (at the final row max), then both
    l_smem.slice(ME * BLOCK_H, BLOCK_H).store(gl.convert_layout(l_me, vec_l))
    gl.thread_barrier()
    mbarrier.arrive(fin_bar, count=1)
    mbarrier.wait(fin_bar, 0)
    l_i = l_me + gl.convert_layout(l_smem.slice((1 - ME) * BLOCK_H, BLOCK_H).load(vec_l),
                                   row_s)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    _store_partials(out, m_old + gl.log2(l_safe), ME == 0, ME * HALF, n_tiles > 0, PO, PL, b,
                    split, pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb,
                    stride_plh, row_s, row_o, col_o, BLOCK_H, HALF, DV, QLEN)


@gluon.jit
def _seesaw_wg0(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
                empty, pa_ready, pb_ready, pa_done, pb_done, sa_done, fin_bar, q_bar, bt_row,
                start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
                pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
                BLOCK_H: gl.constexpr, TILE: gl.constexpr, PAGE: gl.constexpr,
                DV: gl.constexpr, QLEN: gl.constexpr):
    _seesaw_wg(0, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
               empty, pa_ready, pb_ready, pa_done, pb_done, sa_done, fin_bar, q_bar, bt_row,
               start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
               pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
               BLOCK_H, TILE, PAGE, DV, QLEN)


@gluon.jit
def _seesaw_wg1(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
                empty, pa_ready, pb_ready, pa_done, pb_done, sa_done, fin_bar, q_bar, bt_row,
                start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
                pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
                BLOCK_H: gl.constexpr, TILE: gl.constexpr, PAGE: gl.constexpr,
                DV: gl.constexpr, QLEN: gl.constexpr):
    _seesaw_wg(1, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
               empty, pa_ready, pb_ready, pa_done, pb_done, sa_done, fin_bar, q_bar, bt_row,
               start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
               pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
               BLOCK_H, TILE, PAGE, DV, QLEN)
