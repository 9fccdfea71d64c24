"""The Triton kernels of ``decode_attention``: the generic stage 1, the reduce, shared helpers.

``_decode_stage1``
    One program per (kv head x row block, split, request). A tile's rows are the
    ``QLEN x GROUP`` (new token, query head) pairs that share a kv head, token-major, cut
    into ``BLOCK_H``-row blocks, so each K/V tile is read once for every query token and
    head of its kv head. The program walks the tokens of its split in ``BLOCK_N`` tiles,
    gathering each token's page through the block table, and runs an online softmax over
    its rows. Dk may exceed Dv (MLA: 512 latent + 64 rope columns): the tile is loaded as
    a ``BLOCK_D`` main part and a ``BLOCK_DPE`` tail. With ``SHARED_KV`` (v_cache aliases
    k_cache's first Dv columns: absorbed MLA) the main K tile doubles as the V tile, so
    the latent is read from memory once. With ``DIRECT`` (split count 1) it normalizes and
    writes the output itself; otherwise it writes a normalized partial output and its
    log2-sum-exp for each non-empty split.
``_decode_reduce``
    One program per (row = q head x new token, Dv block, request): merges the non-empty
    splits' partials.
The shared-latent kernel with Dv 512 (``_decode_stage1_latent``) lives in ``latent.py``.

Multi-token decode (``QLEN`` new tokens per request, their K/V already in the cache):
token ``t`` sees the first ``seq_len - QLEN + 1 + t`` cached tokens (causal among the new
ones). Splits cut the request's whole live range; each row masks what its token may not
see, and a row that sees nothing in a split stores a partial of weight zero.

fp8 caches (``KV_FP8``): tiles are loaded as fp8 (half the bytes of bf16) and converted in
registers. With a bf16 or fp16 q the dots run in fp16 (``F16_DOTS``; q converted once per
program, saturating at +-65504): fp8 -> fp16 is exact and one packed conversion per two
values on sm_90, while fp8 -> bf16 adds a per-value fp16 -> bf16 conversion that would
bound the kernel below the fp8 read rate; fp16 also keeps 3 more mantissa bits of P than
bf16. With an fp32 q the tiles become fp32. With ``KV_SCALED`` the per-tensor scales are
read by the kernel: ``k_scale`` is folded into the score scale and ``v_scale`` into the
final normalization.

With ``USE_PDL`` the reduce is a programmatic dependent launch: stage 1 lets it launch at
once, and it reads the request's length and sets up before ``griddepcontrol.wait``, which
returns once stage 1 has finished and its partials are visible.

With ``MERGE`` there is no reduce kernel: after storing its partial, each stage-1 program
takes a ticket from an arrival counter of its (request, row block) (zeroed per call); the
program that arrives last merges every split's partials, in split order, into the output.

The grid is (kv head x row block, request, split): the split is the slowest axis, so every
request's first splits launch before any request's later ones, and a program whose split
holds no tokens leaves before its loads (split 0 stays: it writes an empty request's
zeros). With ``GRID_SPLITS == NUM_KV_SPLITS`` split boundaries depend only on the
request's own live length and the config, so a request's bits do not depend on what it is
batched with; a balanced grid (``GRID_SPLITS > NUM_KV_SPLITS``, see :func:`_split_range`)
trades that for work spread evenly over ragged lengths. A page id outside
``[0, num_blocks)`` is never read: here the rows of its tokens point at ``KZ``, a row of
zeros in the cache dtype (the latent stage 1 does so at its 64-row tiles and masks those
loads at narrower ones: fewer instructions there), and their scores are -inf, so they
contribute nothing. The
loads' masks here depend on token positions only (masking them by page id instead
compiled to 949 vs 647 instructions per iteration at the 128-token GQA tile:
docs/decode_notes.md v9).

fp8 tiles whose dot needs them transposed at 16-bit granularity (V, and the shared
latent) are converted by :func:`_fp8_f16` on NVIDIA GPUs (``ASM_CVT``): loaded from shared
memory in a row-vectorized layout, converted, staged as fp16 and read back by
``ldmatrix``. Converting in the dot-operand layout instead (what Triton does for ``.to``)
reads the fp8 bytes one at a time.
"""

import triton
import triton.language as tl


@triton.jit
def _mean_live(SL, stride_sl, window, max_len, batch,
               SLIDING: tl.constexpr, QLEN: tl.constexpr):
    """The batch's mean live length (rounded up): every request's clamped length, less
    what its first new token's window drops, summed over the ``batch`` requests."""
    offs = tl.arange(0, 128)
    total = tl.zeros([128], dtype=tl.int64)
    for i in range(0, batch, 128):
        n = tl.load(SL + (i + offs) * stride_sl, mask=i + offs < batch, other=0)
        n = tl.minimum(tl.maximum(n, 0), max_len)
        if SLIDING:
            n = tl.minimum(n, QLEN - 1 + window)
        total += n.to(tl.int64)
    return tl.cdiv(tl.sum(total, 0), batch).to(tl.int32)


@triton.jit
def _split_range(SL, b, stride_sl, window, max_len, split, batch,
                 NUM_KV_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, SLIDING: tl.constexpr,
                 QLEN: tl.constexpr, GRID_SPLITS: tl.constexpr):
    """``(seq_len, live, chunk, start, end)`` of request ``b``'s split ``split``.

    The length is clamped to [0, the page table's capacity] (a bad length never reads
    past the table); ``live`` tokens (from the first new token's window start, when
    sliding) are cut into chunks of whole ``BLOCK_N`` tiles; trailing splits may be empty.
    With ``GRID_SPLITS == NUM_KV_SPLITS`` a request's chunks are its live length over the
    split count (its bits do not depend on its batch). A balanced grid
    (``GRID_SPLITS > NUM_KV_SPLITS``) cuts every request into chunks no shorter than the
    batch's mean live length over ``NUM_KV_SPLITS``, in up to ``GRID_SPLITS`` splits: a
    request twice the mean gets twice the programs, and every busy program holds about
    the same work.
    """
    seq_len = tl.minimum(tl.maximum(tl.load(SL + b * stride_sl), 0), max_len)
    lo = seq_len * 0
    if SLIDING:
        lo = tl.maximum(seq_len - (QLEN - 1) - window, 0)
    live = seq_len - lo
    chunk = tl.maximum(tl.cdiv(tl.cdiv(live, GRID_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    if GRID_SPLITS > NUM_KV_SPLITS:
        mean = _mean_live(SL, stride_sl, window, max_len, batch, SLIDING, QLEN)
        chunk = tl.maximum(chunk, tl.cdiv(tl.cdiv(mean, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N)
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)
    return seq_len, live, chunk, start, end


@triton.jit
def _tile_rows(pid_h, b, seq_len, window,
               stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh,
               GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
               QLEN: tl.constexpr, SLIDING: tl.constexpr):
    """The rows of program ``pid_h``: ``(kv head, row mask, q offsets, out offsets,
    partial rows, visible end, visible start)``.

    Row ``r`` of the kv head is token ``r // GROUP``, head ``r % GROUP`` of the group;
    its partials live in row ``head * QLEN + token`` of the request. A token's visible
    range is ``[end - window, end)`` with ``end = seq_len - QLEN + 1 + token``.
    """
    kvh = pid_h // HEAD_BLOCKS
    offs_r = (pid_h % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    r_mask = offs_r < QLEN * GROUP
    if QLEN == 1:
        t = offs_r * 0
        g = offs_r
    else:
        t = offs_r // GROUP
        g = offs_r % GROUP
    heads = kvh * GROUP + g
    q_off = b * stride_qb + t * stride_qt + heads * stride_qh
    o_off = b * stride_ob + t * stride_ot + heads * stride_oh
    row_end = seq_len - (QLEN - 1) + t
    row_lo = row_end * 0
    if SLIDING:
        row_lo = tl.maximum(row_end - window, 0)
    return kvh, r_mask, q_off, o_off, heads * QLEN + t, row_end, row_lo


@triton.jit
def _visible(s, offs_n, in_range, row_end, row_lo, bt_row, num_blocks, stride_btp,
             PAGE: tl.constexpr, QLEN: tl.constexpr, SLIDING: tl.constexpr,
             BLOCK_N: tl.constexpr = 0, clean=None):
    """Scores ``s`` with every (row, token) the row may not see set to -inf: tokens out of
    range, tokens of a page id outside ``[0, num_blocks)``, and with several query tokens
    the causal and window limits of each row.

    The tile's page ids are loaded again here, in the scores' layout (cache hits: the
    gather loaded them a tile ahead). Deriving the mask from the prefetched ids instead
    kept them in a second layout across iterations: +28 registers at the GQA tile (156 vs
    128), one resident program per SM fewer and 33% slower at the unsplit GQA grid
    (docs/decode_notes.md v8).

    With ``clean`` (the latent stage 1: whether the split's page ids were all found in the
    cache before its loop) the mask is a 0 / -inf bias over the tile's ``BLOCK_N`` tokens,
    added to the scores: -inf past the range and, only in a split that holds a bad id (a
    uniform branch the serving case skips), at the tokens of its bad pages. A bias rather
    than a mask merged across the branch or a second ``where`` on the scores: those put
    extra predicates or non-wgmma writes into the 64-row tile's loop; the bias leaves it
    at the guard-free build's instruction count (docs/decode_notes.md v10).
    """
    if clean is None:
        pg = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=in_range, other=-1)
        valid = (in_range & (pg >= 0) & (pg < num_blocks))[None, :]
    else:  # tokens out of range (and of bad pages) through the bias instead
        valid = tl.full([1, BLOCK_N], 1, tl.int1)
        bias = tl.where(in_range, 0.0, float("-inf"))
        if not clean:  # a split with an out-of-cache page id: those tokens' scores are -inf
            pg = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=in_range, other=-1)
            bias = tl.where(pg.to(tl.uint32, bitcast=True) < num_blocks, bias, float("-inf"))
        s = s + bias[None, :]
    if QLEN > 1:  # causal among the new tokens: each row has its own visible range
        valid = valid & (offs_n[None, :] < row_end[:, None])
        if SLIDING:
            valid = valid & (offs_n[None, :] >= row_lo[:, None])
    elif clean is not None:
        return s
    return tl.where(valid, s, float("-inf"))


@triton.jit
def _dot_operand(x, UPCAST: tl.constexpr, F16_DOTS: tl.constexpr):
    """A q tile as a dot operand: fp16 for an fp8 cache (saturating), fp32 when the
    interpreter must not do bf16 arithmetic, else as loaded."""
    if F16_DOTS:
        y = tl.clamp(x.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    elif UPCAST:
        y = x.to(tl.float32)
    else:
        y = x
    return y


@triton.jit
def _tile_pages(bt_row, n0, end, page, num_blocks, stride_btp, PAGE: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """``(tokens, in-range mask, readable mask, 64-bit page ids, in-page offsets, next page
    ids)`` of the tile at ``n0`` whose page ids ``page`` were loaded one tile ahead (so the
    K/V gather of a tile does not wait on its own block-table load). A token is readable
    when it is in range and its page id lies in ``[0, num_blocks)``; the generic stage 1
    points the other rows at the zero row (:func:`_row_ptrs`) and masks its loads by the
    in-range mask; the latent one does the same at its 64-row tiles and masks its loads by
    the readable mask at narrower ones."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_next = offs_n + BLOCK_N
    page_next = tl.load(bt_row + (offs_next // PAGE) * stride_btp, mask=offs_next < end,
                        other=-1)
    in_range = offs_n < end
    # tokens past the end carry page id -1: one unsigned compare tests both
    readable = page.to(tl.uint32, bitcast=True) < num_blocks
    return offs_n, in_range, readable, page.to(tl.int64), offs_n % PAGE, page_next


@triton.jit
def _row_ptrs(X, page64, in_page, head, readable, stride_p, stride_t, KZ):
    """Per-token row pointers into cache ``X``: ``KZ`` (a row of zeros) where a token's page
    id is outside the cache, so a hostile block table is never dereferenced."""
    return tl.where(readable, X + (page64 * stride_p + in_page * stride_t + head), KZ)


@triton.jit
def _fp8_f16(x):
    """fp8 e4m3 bytes (as uint8) to fp16, four per instance (``cvt.rn.f16x2.e4m3x2``, exact).

    Marked impure so Triton keeps it where it is written (after a row-vectorized load)
    instead of moving it past the layout change into the dot operand.
    """
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
        "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _dequant(x, dtype, ASM_CVT: tl.constexpr):
    """A loaded fp8 (or interpreter bf16) tile in the dot dtype: :func:`_fp8_f16` with
    ``ASM_CVT``, else ``.to``."""
    if ASM_CVT:
        return _fp8_f16(x.to(tl.uint8, bitcast=True))
    return x.to(dtype)


@triton.jit
def _softmax_step(s, m_i, l_i):
    """One online-softmax step over log2-unit scores: ``(p, alpha, new max, new sum)``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a tile of masked pages may leave the running max at -inf: exponents stay finite
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _scores_scale(s, qk_scale, cap, LOGIT_CAP: tl.constexpr):
    """Scores in log2 units: ``s * qk_scale``, or ``cap * tanh(s * scale / cap) * log2(e)``."""
    if LOGIT_CAP:
        # cap * tanh(x / cap), with tanh(y) = 1 - 2 / (exp(2y) + 1) (saturates cleanly)
        s = cap * (1.0 - 2.0 / (tl.exp2(s * (qk_scale * 2.8853900817779268 / cap)) + 1.0))
        return s * 1.4426950408889634
    return s * qk_scale


@triton.jit
def _merge_if_last(CNT, PO, PL, O, b, pid_h, prow, o_off, r_mask, n_valid,
                   stride_cnt, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
                   DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
                   SPLITS_P2: tl.constexpr):
    """Count this program's split in; the last of its (request, row block) merges them all.

    Called after the program stored its partial, by every program of a non-empty split
    and by split 0 (``n_valid`` of them at least one). The barrier orders every thread's stores
    before the counter's release; the acquiring atomic (one thread, result broadcast
    through a barrier) orders the last program's reads after every other program's
    stores. Partials are read from L2 (``.cg``) in split order, so the merged bits do not
    depend on which program came last.
    """
    tl.debug_barrier()
    ticket = tl.atomic_add(CNT + b * stride_cnt + pid_h, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.maximum(n_valid, 1) - 1:
        tl.debug_barrier()
        pl = PL + b * stride_plb + prow * stride_plh
        offs_s = tl.arange(0, SPLITS_P2)
        lse = tl.load(pl[:, None] + offs_s[None, :],
                      mask=r_mask[:, None] & (offs_s < n_valid)[None, :],
                      other=float("-inf"), cache_modifier=".cg")
        m = tl.max(lse, 1)
        m = tl.where(m == float("-inf"), 0.0, m)
        denom = tl.sum(tl.exp2(lse - m[:, None]), 1)
        inv = 1.0 / tl.where(denom > 0.0, denom, 1.0)
        po = PO + b * stride_pob + prow[:, None] * stride_poh
        o = O + o_off[:, None]
        for c in tl.static_range((DV + BLOCK_C - 1) // BLOCK_C):
            cols = c * BLOCK_C + tl.arange(0, BLOCK_C)
            mask = r_mask[:, None] & (cols < DV)[None, :]
            acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
            for s in range(0, n_valid):
                w = tl.exp2(tl.load(pl + s, mask=r_mask, other=float("-inf"),
                                    cache_modifier=".cg") - m)
                acc += w[:, None] * tl.load(po + s * stride_pos + cols[None, :], mask=mask,
                                            other=0.0, cache_modifier=".cg")
            tl.store(o + cols[None, :], (acc * inv[:, None]).to(O.dtype.element_ty), mask=mask)


@triton.jit
def _decode_stage1(
    Q, K, V, BT, SL, O, PO, PL, CNT, KS, VS, KZ,
    qk_scale, cap, window, max_len, num_blocks,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kp, stride_kh,
    stride_vb, stride_vp, stride_vh,
    stride_btb, stride_btp, stride_sl,
    stride_ob, stride_ot, stride_oh,
    stride_pob, stride_poh, stride_pos,
    stride_plb, stride_plh, stride_cnt,
    GROUP: tl.constexpr, PAGE: tl.constexpr, DV: tl.constexpr, DPE: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr, NUM_KV_SPLITS: tl.constexpr,
    SHARED_KV: tl.constexpr, SLIDING: tl.constexpr, LOGIT_CAP: tl.constexpr,
    UPCAST: tl.constexpr, DIRECT: tl.constexpr, PREC: tl.constexpr, USE_PDL: tl.constexpr,
    MERGE: tl.constexpr, BLOCK_C: tl.constexpr, SPLITS_P2: tl.constexpr,
    QLEN: tl.constexpr, KV_FP8: tl.constexpr, KV_SCALED: tl.constexpr,
    F16_DOTS: tl.constexpr, ASM_CVT: tl.constexpr, GRID_SPLITS: tl.constexpr,
):
    if USE_PDL:  # the reduce may launch now; it waits for this grid before reading
        tl.extra.cuda.gdc_launch_dependents()
    pid_h = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < DV

    seq_len, live, chunk, start, end = _split_range(
        SL, b, stride_sl, window, max_len, split, tl.num_programs(1), NUM_KV_SPLITS, BLOCK_N,
        SLIDING, QLEN, GRID_SPLITS)
    if split > 0 and start >= end:  # an empty split: nothing to store, no ticket to take
        return
    kvh, r_mask, q_off, o_off, prow, row_end, row_lo = _tile_rows(
        pid_h, b, seq_len, window, stride_qb, stride_qt, stride_qh, stride_ob, stride_ot,
        stride_oh, GROUP, BLOCK_H, HEAD_BLOCKS, QLEN, SLIDING)
    if KV_SCALED:  # dequantized K = stored K * k_scale: fold it into the score scale
        qk_scale = qk_scale * tl.load(KS)

    q = tl.load(Q + q_off[:, None] + offs_d[None, :], mask=r_mask[:, None] & d_mask[None, :],
                other=0.0)
    q = _dot_operand(q, UPCAST, F16_DOTS)
    if BLOCK_DPE > 0:
        offs_pe = tl.arange(0, BLOCK_DPE)
        pe_mask = offs_pe < DPE
        q_pe = tl.load(Q + q_off[:, None] + DV + offs_pe[None, :],
                       mask=r_mask[:, None] & pe_mask[None, :], other=0.0)
        q_pe = _dot_operand(q_pe, UPCAST, F16_DOTS)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    k_head = kvh * stride_kh
    v_head = kvh * stride_vh
    bt_row = BT + b * stride_btb
    offs_n = start + tl.arange(0, BLOCK_N)
    page = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=offs_n < end, other=-1)
    for n0 in range(start, end, BLOCK_N):
        offs_n, in_range, readable, page64, in_page, page_next = _tile_pages(
            bt_row, n0, end, page, num_blocks, stride_btp, PAGE, BLOCK_N)
        k_row = _row_ptrs(K, page64, in_page, k_head, readable, stride_kb, stride_kp, KZ)
        k = tl.load(k_row[:, None] + offs_d[None, :],
                    mask=in_range[:, None] & d_mask[None, :], other=0.0)
        if UPCAST or KV_FP8:  # to the dot dtype in registers (fp8: dequantized)
            k = k.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        if BLOCK_DPE > 0:
            k_pe = tl.load(k_row[:, None] + DV + offs_pe[None, :],
                           mask=in_range[:, None] & pe_mask[None, :], other=0.0)
            if UPCAST or KV_FP8:
                k_pe = k_pe.to(q.dtype)
            s += tl.dot(q_pe, tl.trans(k_pe), input_precision=PREC)
        s = _scores_scale(s, qk_scale, cap, LOGIT_CAP)
        s = _visible(s, offs_n, in_range, row_end, row_lo, bt_row, num_blocks, stride_btp,
                     PAGE, QLEN, SLIDING)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        if SHARED_KV:
            v = k
        else:
            v_row = _row_ptrs(V, page64, in_page, v_head, readable, stride_vb, stride_vp, KZ)
            v = tl.load(v_row[:, None] + offs_d[None, :],
                        mask=in_range[:, None] & d_mask[None, :], other=0.0)
            if UPCAST or KV_FP8:
                v = _dequant(v, q.dtype, ASM_CVT)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        page = page_next

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    if KV_SCALED:  # dequantized V = stored V * v_scale
        out = acc * (tl.load(VS) / l_safe)[:, None]
    else:
        out = acc / l_safe[:, None]
    if DIRECT:
        tl.store(O + o_off[:, None] + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=r_mask[:, None] & d_mask[None, :])
    else:
        has_work = start < end
        tl.store(PO + b * stride_pob + prow[:, None] * stride_poh + split * stride_pos
                 + offs_d[None, :], out, mask=(r_mask & has_work)[:, None] & d_mask[None, :])
        tl.store(PL + b * stride_plb + prow * stride_plh + split, m_i + tl.log2(l_safe),
                 mask=r_mask & has_work)
        if MERGE:
            _merge_if_last(CNT, PO, PL, O, b, pid_h, prow, o_off, r_mask, tl.cdiv(live, chunk),
                           stride_cnt, stride_pob, stride_poh, stride_pos, stride_plb,
                           stride_plh, DV, BLOCK_H, BLOCK_C, SPLITS_P2)


@triton.jit
def _decode_reduce(
    SL, PO, PL, O, window, max_len,
    stride_sl, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    stride_ob, stride_ot, stride_oh,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
    SLIDING: tl.constexpr, USE_PDL: tl.constexpr, QLEN: tl.constexpr,
    GRID_SPLITS: tl.constexpr, PLAN: tl.constexpr = False,
):
    row = tl.program_id(0)  # head * QLEN + token
    d_blk = tl.program_id(1)
    b = tl.program_id(2)
    if PLAN:  # SL is the work plan's per-request rows: (first item, items); the partials
        # are one slot per segment (work_plan.py)
        first = tl.load(SL + b * stride_sl)
        n_valid = tl.load(SL + b * stride_sl + 1)
        pl = PL + row * stride_plh + first
        po = PO + row * stride_poh + first * stride_pos
    else:
        _, live, chunk, _, _ = _split_range(SL, b, stride_sl, window, max_len, 0,
                                            tl.num_programs(2), NUM_KV_SPLITS, BLOCK_N,
                                            SLIDING, QLEN, GRID_SPLITS)
        n_valid = tl.cdiv(live, chunk)  # splits that hold tokens; the rest never written
        pl = PL + b * stride_plb + row * stride_plh
        po = PO + b * stride_pob + row * stride_poh
    if USE_PDL:  # seq_lens predate stage 1; its partials are readable after the wait
        tl.extra.cuda.gdc_wait()

    offs_s = tl.arange(0, SPLITS_P2)
    lse = tl.load(pl + offs_s, mask=offs_s < n_valid, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.sum(tl.exp2(lse - m), 0)

    offs_d = d_blk * BLOCK_DV + tl.arange(0, BLOCK_DV)
    d_mask = offs_d < DV
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, n_valid, SPLIT_CHUNK):
        offs_c = s0 + tl.arange(0, SPLIT_CHUNK)
        c_mask = offs_c < n_valid
        w = tl.exp2(tl.load(pl + offs_c, mask=c_mask, other=float("-inf")) - m)
        o = tl.load(po + offs_c[:, None] * stride_pos + offs_d[None, :],
                    mask=c_mask[:, None] & d_mask[None, :], other=0.0)
        acc += tl.sum(w[:, None] * o, 0)
    out = acc / tl.where(denom > 0.0, denom, 1.0)
    o_row = O + b * stride_ob + (row % QLEN) * stride_ot + (row // QLEN) * stride_oh
    tl.store(o_row + offs_d, out.to(O.dtype.element_ty), mask=d_mask)
