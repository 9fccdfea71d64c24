"""A Gluon stage 1 for absorbed-MLA split-KV decode of an fp8 latent with few rows (the
narrow tile: up to 16 (token, head) rows of one request a program; sm_90).

The memory-bound regime (12-16 rows a request: DeepSeek-V3 / Kimi at TP8, one new token)
reads the cache at half the bytes in fp8, so each token's shared-memory traffic and
instructions, not its MMA work, bound the tile. The 64-row Gluon tile pads the rows to 64
(4x the MMA work at 16) and the Triton tile reloads q from shared memory in each warp
every tile. This tile turns the products around, the 64 tokens of a tile as the MMA's M
and the rows as its N (warpgroup MMA, one 4-warp warpgroup):

- scores ``S^T [64 tokens, 16] = K [64, 576] q^T``: with ``F16_QK`` (the default) from
  the tile's fp16 conversion (K's 512 latent columns are V's) and the rope's 64 columns
  converted in registers as the MMA's A operand, q as fp16; else on e4m3 MMAs straight
  from the TMA ring, q split once per program into two e4m3 parts (``x = q * s_r ~ hi +
  lo``, ``s_r`` a power of two per row putting its largest value in [128, 256); ``lo =
  e4m3(x - hi)``: about bf16's 8 significant bits), each 128 columns in an accumulator of
  their own, summed in fp32 and scaled by ``1 / s_r``. The e4m3 form is 1.03-1.08x faster
  but not precise enough (session 31: at logits of ~160 in log2 units, 1.5 against the
  fp16 form's 0.25 max error, which the 64-row tile matches; 3.3-7.6 with one
  accumulator; docs/decode_notes.md v31);
- the online softmax runs down the token axis (a row's max crosses the warps; its sum
  stays per element until the end);
- ``O^T [512, 16] += V^T [512, 64] P^T [64, 16]``: V (the latent's first 512 columns)
  converted per tile to an fp16 tile (exact; at a partial tile the rows past the split's
  end as zeros), read transposed as the MMA's A operand; P (fp16) through shared memory.

Two fp16 V tiles let the steps overlap: tile ``i``'s step issues the PV MMA of tile
``i - 1``, waits tile ``i``'s stage and converts its V under it (and, with e4m3 scores,
under its score MMAs; with fp16 ones they follow the conversion), then waits both MMAs
(nothing is in flight across the loop's back edge) and runs its softmax; the ring's next copy of a stage leaves once its scores and conversion
are done, ``STAGES`` (2) tiles ahead. The split of a request's tokens, the page ids
(``_tile_ids``) and the partials layout are those of ``gluon_mla``'s stage 1, so the
same reduce merges them.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kdispatch.kernels.decode_attention.checks import q_dims
from kdispatch.kernels.decode_attention.gluon_mla import LOG2E, descriptors
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (DPE, DV, _copy_tile,
                                                                _f8_to_f16, _mean_len,
                                                                _tile_ids)

#: tokens a tile
NARROW_TILE = 64
#: the scores from the fp16 V tile (the latent) and the rope converted in registers, q as
#: fp16 (else on e4m3 MMAs from the ring, q in two e4m3 parts: two graph-replay tests
#: failed on those at large logits, session 30; docs/decode_notes.md v30, v31)
F16_QK = True


@gluon.jit
def _q_parts(q_row, rows_live, stride_qr, smem_hi, smem_lo, col0: gl.constexpr,
             COLS: gl.constexpr, scale, q_l: gl.constexpr, F16: gl.constexpr):
    """Columns ``[col0, col0 + COLS)`` of the program's q rows times ``scale`` (per row) to
    shared memory as two e4m3 parts: ``hi = e4m3(x)``, ``lo = e4m3(x - hi)``; with ``F16``
    as fp16 (saturating) in ``smem_hi``."""
    r = gl.arange(0, scale.shape[0], layout=gl.SliceLayout(1, q_l))
    c = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, q_l))
    x = gl.load(q_row + r[:, None] * stride_qr + c[None, :], mask=rows_live[:, None],
                other=0.0).to(gl.float32) * scale[:, None]
    if F16:
        smem_hi.store(gl.minimum(gl.maximum(x, -65504.0), 65504.0).to(gl.float16))
    else:
        hi = x.to(gl.float8e4nv)
        smem_hi.store(hi)
        smem_lo.store((x - hi.to(gl.float32)).to(gl.float8e4nv))


@gluon.jit
def _q_scale(q_row, rows_live, stride_qr, q_l: gl.constexpr, NROWS: gl.constexpr,
             DV: gl.constexpr, DPE: gl.constexpr):
    """Per row, the power of two ``s_r`` putting its largest magnitude in [128, 256) (1
    for a row of zeros)."""
    r = gl.arange(0, NROWS, layout=gl.SliceLayout(1, q_l))
    c = gl.arange(0, DV, layout=gl.SliceLayout(0, q_l))
    a = gl.max(gl.abs(gl.load(q_row + r[:, None] * stride_qr + c[None, :],
                              mask=rows_live[:, None], other=0.0).to(gl.float32)), 1)
    cp = DV + gl.arange(0, DPE, layout=gl.SliceLayout(0, q_l))
    ap = gl.max(gl.abs(gl.load(q_row + r[:, None] * stride_qr + cp[None, :],
                               mask=rows_live[:, None], other=0.0).to(gl.float32)), 1)
    a = gl.maximum(a, ap)
    # floor(log2(a)) from the exponent bits, clamped so 2^(7 - e) stays a normal fp32
    e = ((a.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = gl.where(a > 0.0, gl.minimum(gl.maximum(e, -100), 120), 0)
    return ((127 + 7 - e) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _e4m3_part(k, q_hi, q_lo, col0: gl.constexpr, s_zero):
    """``k[:, col0:col0 + 128] (q_hi + q_lo)^T`` (at most 128 columns: the rope's 64) on
    e4m3 MMAs into a fresh accumulator, in flight."""
    W: gl.constexpr = min(128, k.shape[1] - col0)
    kc = k.slice(col0, W, dim=1)
    s = warpgroup_mma(kc, q_hi.slice(col0, W, dim=1).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    return warpgroup_mma(kc, q_lo.slice(col0, W, dim=1).permute((1, 0)), s, is_async=True)


@gluon.jit
def _v_to_f16(kv, v16, lim, num_warps: gl.constexpr):
    """The stage's 512 latent columns to the fp16 tile, the rows from ``lim`` on as zeros
    at a partial tile only (a uniform branch: full tiles convert unmasked)."""
    if lim < 64:
        _f8_to_f16(kv, v16, lim, 64, 512, num_warps, True)
    else:
        _f8_to_f16(kv, v16, lim, 64, 512, num_warps, False)


@gluon.jit
def _narrow_stage1(
    q_ptr, kv_desc, pe_desc, BT, SL, PO, PL, KS, VS,
    qk_scale, max_len, num_pages, heads, stride_qr,
    stride_btb, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    NUM_KV_SPLITS: gl.constexpr, NROWS: gl.constexpr, PAGE: gl.constexpr,
    DV: gl.constexpr, DPE: gl.constexpr, GRID_SPLITS: gl.constexpr, num_warps: gl.constexpr,
    QLEN: gl.constexpr = 1, STAGES: gl.constexpr = 2, KV_SCALED: gl.constexpr = False,
    F16_QK: gl.constexpr = False,
):
    gl.static_assert(num_warps == 4)
    gl.static_assert(NROWS == 16)
    TILE: gl.constexpr = 64
    gl.static_assert(TILE % PAGE == 0 or PAGE == TILE)
    b = gl.program_id(1)
    split = gl.program_id(2)
    seq_len = gl.minimum(gl.maximum(gl.load(SL + b), 0), max_len)
    chunk = gl.maximum(gl.cdiv(gl.cdiv(seq_len, GRID_SPLITS), TILE) * TILE, TILE)
    if GRID_SPLITS > NUM_KV_SPLITS:
        mean = _mean_len(SL, max_len, gl.num_programs(1), num_warps)
        chunk = gl.maximum(chunk, gl.cdiv(gl.cdiv(mean, NUM_KV_SPLITS), TILE) * TILE)
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    if split > 0 and end <= start:  # an empty split
        return
    n_tiles = gl.maximum(gl.cdiv(end - start, TILE), 0)
    bt_row = BT + b * stride_btb
    oob_row = num_pages * PAGE

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(  # (K 32: e4m3 operands)
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NROWS, 16 if F16_QK else 32])
    # F16_QK: the scores from the fp16 V tile (K's latent columns) and the rope converted
    # in registers (the MMA's A operand), q as fp16; one P buffer (its one reader, the PV
    # MMA of the tile before, is waited before the next P is stored)
    P_BUFS: gl.constexpr = 1 if F16_QK else 2
    rope_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NROWS, 16])
    tok_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])

    kv_smem = gl.allocate_shared_memory(kv_desc.dtype, [STAGES, TILE, DV], kv_desc.layout)
    pe_smem = gl.allocate_shared_memory(pe_desc.dtype, [STAGES, TILE, DPE], pe_desc.layout)
    # two fp16 V tiles and two P buffers: tile i's, while the PV MMA of tile i - 1 reads
    # the other's
    l16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                             rank=2)
    v16 = gl.allocate_shared_memory(gl.float16, [2, TILE, DV], l16)
    p_smem = gl.allocate_shared_memory(
        gl.float16, [P_BUFS, TILE, NROWS], gl.NVMMASharedLayout.get_default_for([TILE, NROWS],
                                                                                gl.float16))
    QT: gl.constexpr = gl.float16 if F16_QK else gl.float8e4nv
    lq: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NROWS, DV], QT)
    lqp: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NROWS, DPE], QT)
    q_hi = gl.allocate_shared_memory(QT, [NROWS, DV], lq)
    qp_hi = gl.allocate_shared_memory(QT, [NROWS, DPE], lqp)
    if F16_QK:
        q_lo = q_hi  # (unused)
        qp_lo = qp_hi
    else:
        q_lo = gl.allocate_shared_memory(QT, [NROWS, DV], lq)
        qp_lo = gl.allocate_shared_memory(QT, [NROWS, DPE], lqp)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
    fence_async_shared()

    # the first STAGES tiles' copies, under q's preparation
    for j in gl.static_range(STAGES):
        r0, r1, r2, r3, _ = _tile_ids(bt_row, start + j * TILE, end, j < n_tiles, num_pages,
                                      oob_row, TILE, PAGE)
        _copy_tile(kv_desc, pe_desc, kv_smem, pe_smem, ready, r0, r1, r2, r3, j < n_tiles, j,
                   TILE, PAGE)

    # q: the request's rows (row r: token r // heads, head r % heads), in two e4m3 parts
    q_row = q_ptr + (b * (QLEN * heads)).to(gl.int64) * stride_qr
    rows_q = gl.arange(0, NROWS, layout=gl.SliceLayout(1, q_l))
    live_q = rows_q < QLEN * heads
    if F16_QK:
        qs = gl.full([NROWS], 1.0, gl.float32, layout=gl.SliceLayout(1, q_l))
        colmul = gl.full([NROWS], qk_scale, gl.float32, layout=row_s)
    else:
        qs = _q_scale(q_row, live_q, stride_qr, q_l, NROWS, DV, DPE)
        colmul = qk_scale / gl.convert_layout(qs, row_s)
    if KV_SCALED:  # the dequantized latent (as K) = stored * k_scale
        colmul = colmul * gl.load(KS)
    for c in gl.static_range(DV // 128):
        _q_parts(q_row, live_q, stride_qr, q_hi.slice(c * 128, 128, dim=1),
                 q_lo.slice(c * 128, 128, dim=1), c * 128, 128, qs, q_l, F16_QK)
    _q_parts(q_row, live_q, stride_qr, qp_hi, qp_lo, DV, DPE, qs, q_l, F16_QK)
    # the second V tile and P buffer as zeros: the first tile's step runs the PV MMA of
    # "tile -1" on them (adding nothing), as a split without tiles runs the last one
    zero_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    for c in gl.static_range(DV // 64):
        v16.index(1).slice(c * 64, 64, dim=1).store(
            gl.zeros([TILE, 64], gl.float16, layout=zero_l))
    p_smem.index(P_BUFS - 1).store(gl.zeros([TILE, NROWS], gl.float16, layout=zero_l))
    fence_async_shared()
    gl.thread_barrier()

    rows = gl.arange(0, NROWS, layout=row_s)
    row_end = gl.full([NROWS], 0, gl.int32, layout=row_s) + end
    if QLEN > 1:  # each row's visible end: its token's causal limit, within the split
        row_end = gl.minimum(seq_len - (QLEN - 1) + rows // heads, end)
    offs_t = gl.arange(0, TILE, layout=tok_s)
    if PAGE >= TILE:
        page_bit: gl.constexpr = 1
    else:
        page_bit = (1 << (offs_t // PAGE))[:, None]
    m_i = gl.full([NROWS], float("-inf"), gl.float32, layout=row_s)
    l_2d = gl.zeros([TILE, NROWS], gl.float32, layout=s_layout)
    acc = gl.zeros([DV, NROWS], gl.float32, layout=o_layout)
    s_zero = gl.zeros([TILE, NROWS], gl.float32, layout=s_layout)
    bits = _tile_ids(bt_row, start, end, n_tiles > 0, num_pages, oob_row, TILE, PAGE)[4]

    for i in range(n_tiles):
        st = i % STAGES
        buf = i % 2
        n0 = start + i * TILE
        # the ids of the copy this stage takes next and the next tile's validity bits,
        # loaded under this tile's wait
        nxt = i + STAGES < n_tiles
        r0, r1, r2, r3, _ = _tile_ids(bt_row, n0 + STAGES * TILE, end, nxt, num_pages,
                                      oob_row, TILE, PAGE)
        bits_next = _tile_ids(bt_row, n0 + TILE, end, i + 1 < n_tiles, num_pages, oob_row,
                              TILE, PAGE)[4]
        # the PV MMA of the tile before (its P and V in the other buffers), in flight under
        # this tile's scores and conversion
        acc = warpgroup_mma(v16.index(1 - buf).permute((1, 0)),
                            p_smem.index((i + P_BUFS - 1) % P_BUFS), acc, is_async=True)
        mbarrier.wait(ready.index(st), (i // STAGES) & 1)
        kv = kv_smem.index(st)
        pe = pe_smem.index(st)
        if F16_QK:  # the conversion first: the latent's scores read its fp16 tile
            _v_to_f16(kv, v16.index(buf), end - n0, num_warps)
            rope = pe.load(rope_l).to(gl.float16)
            fence_async_shared()
            gl.thread_barrier()
            s = warpgroup_mma(v16.index(buf), q_hi.permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
            s = warpgroup_mma(rope, qp_hi.permute((1, 0)), s, is_async=True)
            # both waited here: nothing in flight across the loop's back edge
            acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s))
        else:  # e4m3 scores from the ring, V's conversion under them; each 128 columns
            # in an accumulator of their own, summed in fp32 (an fp8 MMA accumulates in
            # fewer bits: one accumulator over all 576 lost ~2^-9 of the largest logits)
            s0 = _e4m3_part(kv, q_hi, q_lo, 0, s_zero)
            s1 = _e4m3_part(kv, q_hi, q_lo, 128, s_zero)
            s2 = _e4m3_part(kv, q_hi, q_lo, 256, s_zero)
            s3 = _e4m3_part(kv, q_hi, q_lo, 384, s_zero)
            s4 = _e4m3_part(pe, qp_hi, qp_lo, 0, s_zero)
            _v_to_f16(kv, v16.index(buf), end - n0, num_warps)
            fence_async_shared()
            gl.thread_barrier()
            acc, s0, s1, s2, s3, s4 = warpgroup_mma_wait(num_outstanding=0,
                                                         deps=(acc, s0, s1, s2, s3, s4))
            s = (s0 + s1) + (s2 + s3) + s4
        # the stage is read (scores, conversion): its next copy leaves
        _copy_tile(kv_desc, pe_desc, kv_smem, pe_smem, ready, r0, r1, r2, r3, nxt, st, TILE,
                   PAGE)
        # the softmax down the tokens
        visible = (((bits & page_bit) != 0) & ((n0 + offs_t) < end)[:, None]
                   & ((n0 + offs_t)[:, None] < row_end[None, :]))
        s = gl.where(visible, s * colmul[None, :], float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[None, :])
        l_2d = l_2d * alpha[None, :] + p
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, row_o)[None, :]
        p_smem.index(i % P_BUFS).store(p.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        bits = bits_next

    # the last tile's PV MMA (zeros without tiles)
    last = (n_tiles + 1) % 2
    acc = warpgroup_mma(v16.index(last).permute((1, 0)),
                        p_smem.index((n_tiles + P_BUFS - 1) % P_BUFS), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    l_i = gl.sum(l_2d, 0)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    inv = 1.0 / l_safe
    if KV_SCALED:  # the dequantized latent (as V) = stored * v_scale
        inv = inv * gl.load(VS)
    out = acc * gl.convert_layout(inv, row_o)[None, :]
    # partial row r -> head * QLEN + token
    rows_o = gl.arange(0, NROWS, layout=row_o)
    prow_o = (rows_o % heads) * QLEN + rows_o // heads
    cols_o = gl.arange(0, DV, layout=col_o)
    has_work = n_tiles > 0
    po = (PO + b * stride_pob + split * stride_pos + prow_o[None, :] * stride_poh
          + cols_o[:, None])
    gl.store(po, out, mask=has_work & (rows_o < QLEN * heads)[None, :])
    prow_s = (rows % heads) * QLEN + rows // heads
    gl.store(PL + b * stride_plb + prow_s * stride_plh + split, m_i + gl.log2(l_safe),
             mask=has_work & (rows < QLEN * heads))


def narrow_constexprs(splits: int, grid_splits: int, rows_block: int, page: int,
                      q_len: int, scaled: bool, stages: int) -> dict:
    """The narrow stage 1's constexprs (``rows_block``: 16 or 32 rows a program)."""
    return {"NUM_KV_SPLITS": splits, "NROWS": rows_block, "PAGE": page, "DV": DV, "DPE": DPE,
            "QLEN": q_len, "GRID_SPLITS": grid_splits, "STAGES": stages,
            "KV_SCALED": scaled, "F16_QK": F16_QK}


def narrow_args(q, kv_cache, block_table, seq_lens, scale, po, pl, k_scale=None,
                v_scale=None) -> tuple:
    """The narrow stage 1's positional arguments: q's rows (one 2-D row view, copied when
    its rows are not uniform), the cache's TMA descriptors (``gluon_mla.descriptors``),
    partials ``po`` ``[B, QLEN * H, grid_splits, 512]`` and ``pl`` ``[B, QLEN * H,
    grid_splits]`` (row ``head * QLEN + token``, as ``gluon_mla``'s), the scales (one
    fp32 element each, read on the device) or none."""
    _, _, h, _ = q_dims(q)
    page = kv_cache.shape[1]
    _, _, kd, ped, q2 = descriptors(q, kv_cache)
    scaled = k_scale is not None
    return (q2, kd, ped, block_table, seq_lens, po, pl,
            k_scale if scaled else seq_lens, v_scale if scaled else seq_lens,
            float(scale) * LOG2E, block_table.shape[1] * page, kv_cache.shape[0], h,
            q2.stride(-2), block_table.stride(0), po.stride(0), po.stride(1), po.stride(2),
            pl.stride(0), pl.stride(1))
