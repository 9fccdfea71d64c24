"""The Gluon MLA stage 1 with both warpgroups on each tile (``gluon_mla``): fp8 latents
(each stage converted to one fp16 tile; bf16 latents, which took it in 16- and 32-token
pages, run the seesaw at every page size). Each warpgroup takes 32 of a tile's 64 token
columns of the scores and 256 of the output's 512 columns; score MMA, softmax and PV MMA
run in series."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

# the tile's geometry. The kernels take it as parameters of these names; the code hash
# (kdispatch/source_hash.py) records the value of any module constant a kernel names, so
# the constants stay visible here as in the one module the H200 table was tuned on
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (  # noqa: F401
    BLOCK_H, BLOCK_N, DV)
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (_f8_to_f16, _free_q,
                                                                _q_to_f16, _segment,
                                                                _softmax, _store_partials,
                                                                _tile_ids, _zero_tail)


@gluon.jit
def _tile_step(i, g, bits, m_i, l_2d, acc, q_mma, qpe_mma, kv_smem, pe_smem, p_smem, kv16, pe16,
               ready, empty, bt_row, start, end, n_tiles, num_pages, oob_row, qk_scale,
               clean_end, row_end, offs_t, page_bit, s_zero, row_o: gl.constexpr,
               zero_l: gl.constexpr, BLOCK_N: gl.constexpr, PAGE: gl.constexpr,
               DV: gl.constexpr, QLEN: gl.constexpr, KV_FP8: gl.constexpr,
               num_warps: gl.constexpr):
    """Tile ``i`` (the ring's ``g + i``-th: ``g`` tiles of earlier segments before it): its
    scores, softmax and PV, each waited in turn. Returns the next tile's validity bits and
    the updated ``m_i``, ``l_2d``, ``acc``."""
    st = (g + i) % 2
    n0 = start + i * BLOCK_N
    if KV_FP8:
        kv = kv16
        pe = pe16
    else:
        kv = kv_smem.index(st)
        pe = pe_smem.index(st)
    # the next tile's bits (an id load or four, under this tile's wait and MMAs)
    bits_next = _tile_ids(bt_row, n0 + BLOCK_N, end, i + 1 < n_tiles, num_pages, oob_row,
                          BLOCK_N, PAGE)[4]
    mbarrier.wait(ready.index(st), ((g + i) // 2) & 1)
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
        _zero_tail(kv, end - n0, zero_l, BLOCK_N, DV)
    s = warpgroup_mma(qpe_mma, pe.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(q_mma, kv.permute((1, 0)), s, is_async=True)
    # waits this warpgroup's score MMA (its PV MMA was waited last tile)
    s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))
    p, alpha, m_i, l_2d = _softmax(s, bits, n0, m_i, l_2d, qk_scale, clean_end, end, row_end,
                                   offs_t, page_bit, BLOCK_N, PAGE, QLEN)
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()  # every warp's P is in shared memory before the MMA reads it
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    acc = warpgroup_mma(p_smem, kv, acc, is_async=True)
    # an accumulator in flight across the back edge makes ptxas serialize the wgmmas
    # (C7515, or C7514 when waited after the next score MMA); waiting here keeps each
    # chain pipelined
    acc = warpgroup_mma_init(warpgroup_mma_wait(num_outstanding=0, deps=(acc,)))
    gl.thread_barrier()  # both warpgroups' MMAs are done with the tile
    if not KV_FP8:  # the copy warp may refill the stage (fp8: the next tile's conversion
        # may overwrite the fp16 tile)
        mbarrier.arrive(empty.index(st), count=1)
    return bits_next, m_i, l_2d, acc


@gluon.jit
def _consumer_seg(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, kv16, pe16, ready, empty,
                  q_bar, q_free, bt_row, start, end, n_tiles, seq_len, num_pages, oob_row,
                  qk_scale, KS, VS, PO, PL, b, split, pid_h, heads, stride_pob, stride_poh,
                  stride_pos, stride_plb, stride_plh, g, seg, BLOCK_H: gl.constexpr,
                  BLOCK_N: gl.constexpr, PAGE: gl.constexpr, DV: gl.constexpr,
                  QLEN: gl.constexpr, KV_FP8: gl.constexpr, KV_SCALED: gl.constexpr,
                  num_warps: gl.constexpr, PLAN: gl.constexpr):
    """The two warpgroups' tile loop (scores, online softmax, PV) and the partials of one
    segment of tokens ``[start, end)``: a split's, or a work plan's segment ``seg`` of its
    part after ``g`` tiles (``PLAN``: q freed for the copy warp once the loop is done)."""
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
    # a tile ending at or before ``clean_end`` with every page read needs no mask
    clean_end = end
    row_end = end  # (QLEN = 1: the split's end)
    if QLEN > 1:  # each row's visible end: its token's causal limit, within the split
        tok_s = (pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)) // heads
        row_end = gl.minimum(seq_len - (QLEN - 1) + tok_s, end)
        clean_end = gl.minimum(seq_len - (QLEN - 1) + (pid_h * BLOCK_H) // heads, end)
    mbarrier.wait(q_bar, seg & 1)
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
        bits, m_i, l_2d, acc = _tile_step(
            i, g, bits, m_i, l_2d, acc, q_mma, qpe_mma, kv_smem, pe_smem, p_smem, kv16, pe16,
            ready, empty, bt_row, start, end, n_tiles, num_pages, oob_row, qk_scale,
            clean_end, row_end, offs_t, page_bit, s_zero, row_o, zero_l, BLOCK_N, PAGE, DV,
            QLEN, KV_FP8, num_warps)

    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _free_q(q_free, PLAN)  # every warp's MMAs are done with q (each tile's were waited)
    l_i = gl.sum(l_2d, 1)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    if KV_SCALED:  # the dequantized latent (as V) = stored * v_scale
        out = acc * gl.convert_layout(gl.load(VS) / l_safe, row_o)[:, None]
    else:
        out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    _store_partials(out, m_i + gl.log2(l_safe), True, 0, n_tiles > 0, PO, PL, b, split, pid_h,
                    heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, row_s,
                    row_o, col_o, BLOCK_H, DV, DV, QLEN)


@gluon.jit
def _consumer(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, kv16, pe16, ready, empty, q_bar,
              q_free, bt_row, start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, KS,
              VS, PO, PL, b, split, pid_h, heads, stride_pob, stride_poh, stride_pos,
              stride_plb, stride_plh, WP, SL, BT, stride_btb, max_len, seg0, n_seg,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, PAGE: gl.constexpr,
              DV: gl.constexpr, QLEN: gl.constexpr, KV_FP8: gl.constexpr,
              KV_SCALED: gl.constexpr, num_warps: gl.constexpr, PLAN: gl.constexpr):
    """The two warpgroups over their program's work: the split's tokens, or (``PLAN``) the
    ``n_seg`` segments of its part from slot ``seg0`` on (work_plan.py)."""
    if PLAN:
        g = n_seg * 0
        for k in range(n_seg):
            b, start, end, seq_len, n_tiles, bt_row = _segment(WP, SL, BT, stride_btb, max_len,
                                                               seg0 + k, BLOCK_N)
            _consumer_seg(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, kv16, pe16, ready,
                          empty, q_bar, q_free, bt_row, start, end, n_tiles, seq_len,
                          num_pages, oob_row, qk_scale, KS, VS, PO, PL, b, seg0 + k, pid_h,
                          heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, g,
                          k, BLOCK_H, BLOCK_N, PAGE, DV, QLEN, KV_FP8, KV_SCALED, num_warps,
                          True)
            g += n_tiles
    else:
        _consumer_seg(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, kv16, pe16, ready, empty,
                      q_bar, q_free, bt_row, start, end, n_tiles, seq_len, num_pages, oob_row,
                      qk_scale, KS, VS, PO, PL, b, split, pid_h, heads, stride_pob,
                      stride_poh, stride_pos, stride_plb, stride_plh, 0, 0, BLOCK_H, BLOCK_N,
                      PAGE, DV, QLEN, KV_FP8, KV_SCALED, num_warps, False)
