"""A Gluon stage 1 for absorbed-MLA split-KV decode on sm_90 (``kernel="gluon"``).

Issue 18's compute-bound regime: 64 rows of one request per program, one latent KV head
whose rows are 576 wide (512 latent + 64 rope; V is the first 512 columns of the same
row), bf16 or fp8 (below), 16-, 32- or 64-token pages (``PAGE``) in 64-token tiles
(``BLOCK_N``). A request's rows are its ``QLEN x H`` (new token, head) pairs, token-major
as in the Triton latent stage 1 (``_tile_rows``): row ``r`` is token ``r // H``, head
``r % H``, and sees the tokens ``[0, seq_len - QLEN + 1 + r // H)`` (causal among the new
tokens); the request's rows fill ``cdiv(QLEN * H, 64)`` programs, the last one's rows past
``QLEN * H`` are padding (q read from the next request or zero-filled by TMA, finite
scores, nothing stored). Every form:

- a tile's ``64 // PAGE`` pages arrive by TMA (``PAGE``-row boxes of two descriptors over
  the same cache, the latent columns and the 64 rope columns, into rows ``j * PAGE`` of
  the stage's tile) into a 2-stage shared-memory ring (all ``64 // PAGE`` pages are always
  copied: the tile's bytes are one constant); q (64 x 576) is loaded by TMA once and stays
  in shared memory;
- the copies come from a warp of their own (``gl.warp_specialize``:
  :func:`~kdispatch.kernels.decode_attention.gluon_mla_tiles._producer`): it loads a
  tile's page ids, waits until the MMA warpgroups released the stage (``empty``) and
  issues the tile's copies; its warpgroup (three warps idle) gives its registers up and
  the two MMA warpgroups take 240 a thread (``maxnreg=168`` at launch: 12 warps x 32 x 168
  fit the SM's 65,536);
- scores ``S = q_pe k_pe^T + q_lat k_lat^T`` and ``O += P V`` by warpgroup MMA, V read from
  the same latent tile, the online softmax in registers (log2 units), ``P`` (bf16) through
  shared memory; each warpgroup holds 256 of the output's 512 columns (a 64 x 256 fp32
  accumulator, 128 registers a thread).

Two forms share that (:func:`seesaw` says which):

- **the seesaw** (bf16 latents at every page size; ``gluon_mla_seesaw``): two 4-warp
  warpgroups, each scoring every other tile (64 x 64 score MMAs) and passing ``P`` and
  the row max to the other through shared memory, so one warpgroup's softmax runs under
  the other's MMAs (session 23: 0.86x the time of the form below at 128 heads b32 x
  16,384, docs/decode_notes.md v23). Each stage arrives in nine 64-column blocks, each
  completing a ``ready`` mbarrier of its own, and is released in three parts (the rope,
  the latent's left and right halves: three ``empty`` mbarriers a stage) by each part's
  last reader, so the copy warp refills a stage part by part (the module's protocol);
- **both warpgroups on each tile** (fp8 latents; ``gluon_mla_consumer``): one ``ready``
  and one ``empty`` mbarrier per stage, each page two copies (the 512 latent columns, the
  rope); each warpgroup scores 32 of a tile's 64 token columns, the row max crosses
  warpgroups in shared memory, and score MMA, softmax and PV MMA run in series. The PV
  MMA is waited at the end of each tile (one left in flight into the next tile's score
  MMA makes ptxas serialize the wgmmas, C7515 or C7514 by the form: v12, v21).

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
the MMA warpgroups take from the tile's ids (``_tile_ids``, loaded ahead of the tile's
wait, as the copy warp loads them for its copies); a tile whose pages were all read and
that ends before every row's end scales its scores with no mask, a uniform branch). Rows of the last
(partial) tile past the split's end are zeroed in shared memory before the PV MMA (a
stale row must not turn ``0 * NaN`` into a NaN). The split of a request's tokens and the
partials layout (``[B, QLEN * H, splits, 512]`` fp32 partial outputs and
``[B, QLEN * H, splits]`` log2-sum-exp, row ``head * QLEN + token``) are those of the
Triton stage 1 with ``BLOCK_N = 64``, so the existing :func:`_decode_reduce` (with
``QLEN``) merges them.

With a work plan (``PLAN``, work_plan.py) each program is persistent: it walks the
segments of its part (requests' token ranges, one partial slot each), its copy warp
loading each segment's q once both MMA partitions freed the last one (``q_free``), the
ring's laps and the mbarriers' phases carried from segment to segment.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kdispatch.dtypes import torch_dtype
from kdispatch.kernels._common import interpreting
from kdispatch.kernels.decode_attention.checks import q_dims, shares_latent
from kdispatch.kernels.decode_attention.gluon_mla_consumer import _consumer
from kdispatch.kernels.decode_attention.gluon_mla_seesaw import (_seesaw_producer, _seesaw_wg0,
                                                                 _seesaw_wg1)
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (BLOCK_H, BLOCK_N, DPE, DV,
                                                                _load_q, _mean_len,
                                                                _plan_producer)
from kdispatch.kernels.decode_attention.spec import (GLUON_HEAD_DIMS, GLUON_KV_DTYPES,
                                                     GLUON_PAGE_SIZES, gluon_config,
                                                     narrow_config)

#: the cache dtypes the tile takes (the dispatch key's ``GLUON_KV_DTYPES``)
GLUON_CACHE_DTYPES = tuple(torch_dtype(name) for name in GLUON_KV_DTYPES)

LOG2E = 1.4426950408889634
#: registers a thread at launch: 12 warps (the copy warp's group rounds up to 4) x 32 x 168
#: fit the SM's 65,536; the copy warp's group then gives its registers up (32 a thread; 24
#: in the seesaw) and the two warpgroups take what that frees (240). The literals in the
#: ``warp_specialize`` calls are these (named constants there would move the code hash
#: the H200 table was tuned on)
MAXNREG = 168
COPY_WARP_REGS = 32
SEESAW_COPY_WARP_REGS = 24
SEESAW_WG_REGS = 240


@gluon.jit
def _gluon_mla_stage1(
    q_desc, qpe_desc, kv_desc, pe_desc, BT, SL, PO, PL, KS, VS, WP, WPP,
    qk_scale, max_len, num_pages, heads,
    stride_btb, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    NUM_KV_SPLITS: gl.constexpr, BLOCK_H: gl.constexpr, PAGE: gl.constexpr,
    DV: gl.constexpr, DPE: gl.constexpr, GRID_SPLITS: gl.constexpr, num_warps: gl.constexpr,
    QLEN: gl.constexpr = 1, BLOCK_N: gl.constexpr = 64, KV_FP8: gl.constexpr = False,
    KV_SCALED: gl.constexpr = False, PLAN: gl.constexpr = False,
):
    # a bf16 latent: the seesaw (two 4-warp warpgroups, each scoring every other tile);
    # fp8: both warpgroups on each tile (its bytes converted per tile)
    SEESAW: gl.constexpr = not KV_FP8
    gl.static_assert(num_warps == (4 if SEESAW else 8))
    gl.static_assert(BLOCK_H == 64)
    gl.static_assert(BLOCK_N == 64)
    gl.static_assert(BLOCK_N % PAGE == 0)
    TILE: gl.constexpr = BLOCK_N
    STAGES: gl.constexpr = 2
    pid_h = gl.program_id(0)
    smem_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
    if PLAN:  # a persistent program over the work plan's part ``program_id(1)``: its
        # segments (work_plan.py), each read by the partitions; a segment's partials go to
        # its slot (the launcher passes zero batch strides)
        part = gl.program_id(1)
        seg0 = gl.load(WPP + part * 2)
        n_seg = gl.load(WPP + part * 2 + 1) - seg0 + 1  # (first slot, last slot)
        if n_seg <= 0:  # a part without tiles
            return
        b = seg0 * 0  # (the segments' own, in the partitions)
        split = b
        start = b
        end = b
        seq_len = b
    else:
        seg0 = 0
        n_seg = 1
        b = gl.program_id(1)
        split = gl.program_id(2)
        # the request's token range of this split: _split_range with BLOCK_N = 64 (from
        # seq_len: with QLEN > 1 the rows' own ends only mask), balanced as it is
        seq_len = gl.minimum(gl.maximum(gl.load(SL + b), 0), max_len)
        chunk = gl.maximum(gl.cdiv(gl.cdiv(seq_len, GRID_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
        if GRID_SPLITS > NUM_KV_SPLITS:
            mean = _mean_len(SL, max_len, gl.num_programs(1), num_warps)
            chunk = gl.maximum(chunk, gl.cdiv(gl.cdiv(mean, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N)
        start = split * chunk
        end = gl.minimum(start + chunk, seq_len)
        if split > 0 and end <= start:  # an empty split: leaves before its TMA setup
            return
    n_tiles = gl.maximum(gl.cdiv(end - start, TILE), 0)
    bt_row = BT + b * stride_btb
    oob_row = num_pages * PAGE  # a copy from here on is all out of bounds: zeros, no read

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, DV], smem_l)
    qpe_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, DPE], smem_l)
    # the TMA ring: the cache's own dtype (bf16, or fp8 bytes converted per tile)
    kv_smem = gl.allocate_shared_memory(kv_desc.dtype, [STAGES, TILE, DV], kv_desc.layout)
    pe_smem = gl.allocate_shared_memory(pe_desc.dtype, [STAGES, TILE, DPE], pe_desc.layout)
    # the seesaw: one ready mbarrier per 64-column block of a stage (9: the latent's 8,
    # then the rope) and one empty mbarrier per part of it (3: the rope, the latent's left
    # half, its right half), each released by the part's last reader (gluon_mla_seesaw);
    # else one of each per stage, the stage released by both warpgroups together
    NRDY: gl.constexpr = STAGES * 9 if SEESAW else STAGES
    NEMPTY: gl.constexpr = STAGES * 3 if SEESAW else STAGES
    ready = gl.allocate_shared_memory(gl.int64, [NRDY, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NEMPTY, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    # the plan: a segment's q is free for the next (one arrive from each MMA partition)
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NRDY):
        mbarrier.init(ready.index(j), count=1)
        if j < NEMPTY:
            mbarrier.init(empty.index(j), count=1)
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_free, count=2 if SEESAW else 1)
    if not SEESAW:
        # the dots' dtype: bf16, or fp16 for an fp8 latent (e4m3 -> fp16 is one packed
        # conversion on sm_90; q's bf16 values convert exactly within fp16's range)
        if KV_FP8:
            DOT: gl.constexpr = gl.float16
        else:
            DOT: gl.constexpr = gl.bfloat16
        p_smem = gl.allocate_shared_memory(DOT, [BLOCK_H, TILE], smem_l)
        if KV_FP8:  # one fp16 tile both dots read, converted from the ring's stage per tile
            kv16 = gl.allocate_shared_memory(gl.float16, [TILE, DV], smem_l)
            pe16 = gl.allocate_shared_memory(gl.float16, [TILE, DPE], smem_l)
        else:  # (unused)
            kv16 = kv_smem
            pe16 = pe_smem
    else:  # the seesaw's P (of A, then of B), the pair's row maxes, the row sums at the end
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, TILE], smem_l)
        vec_s: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        m_smem = gl.allocate_shared_memory(gl.float32, [2 * BLOCK_H], vec_s)
        l_smem = gl.allocate_shared_memory(gl.float32, [2 * BLOCK_H], vec_s)
        # A's P ready, B's P ready, A scored, A's P read (one arrive each: warpgroup 0's,
        # 1's, 0's, 0's); the row sums stored (one arrive from each warpgroup)
        sync = gl.allocate_shared_memory(gl.int64, [5, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(5):
            mbarrier.init(sync.index(j), count=1 if j < 4 else 2)
    fence_async_shared()

    # the request's rows are contiguous in q's row view: the box starts at its first row
    # plus the tile's (a box past the descriptor's end is zero-filled)
    if not PLAN:  # (the plan's copy warp loads each segment's)
        _load_q(q_desc, qpe_desc, q_smem, qpe_smem, q_bar, q_free, 0, b, pid_h, heads,
                BLOCK_H, QLEN)

    if not SEESAW:
        gl.warp_specialize([
            (_consumer, (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, kv16, pe16, ready, empty,
                         q_bar, q_free, bt_row, start, end, n_tiles, seq_len, num_pages,
                         oob_row, qk_scale, KS, VS, PO, PL, b, split, pid_h, heads,
                         stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, WP, SL,
                         BT, stride_btb, max_len, seg0, n_seg, BLOCK_H, TILE, PAGE, DV, QLEN,
                         KV_FP8, KV_SCALED, num_warps, PLAN)),
            (_plan_producer, (kv_desc, pe_desc, q_desc, qpe_desc, kv_smem, pe_smem, q_smem,
                              qpe_smem, ready, empty, q_bar, q_free, bt_row, start, end,
                              n_tiles, num_pages, oob_row, pid_h, heads, WP, SL, BT,
                              stride_btb, max_len, seg0, n_seg, TILE, PAGE, STAGES, BLOCK_H,
                              QLEN, PLAN)),
        ], [1], [32])  # COPY_WARP_REGS
    else:
        # (the two warpgroups' argument tuples are written out: a tuple held in a variable
        # turns its constexprs into tensors)
        gl.warp_specialize([
            (_seesaw_wg0, (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
                          empty, sync.index(0), sync.index(1), sync.index(3), sync.index(2),
                          sync.index(4), q_bar, q_free, bt_row, start, end, n_tiles,
                          seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split, pid_h,
                          heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
                          WP, SL, BT, stride_btb, max_len, seg0, n_seg,
                          BLOCK_H, TILE, PAGE, DV, QLEN, PLAN)),
            (_seesaw_wg1, (q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
                          empty, sync.index(0), sync.index(1), sync.index(3), sync.index(2),
                          sync.index(4), q_bar, q_free, bt_row, start, end, n_tiles,
                          seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split, pid_h,
                          heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
                          WP, SL, BT, stride_btb, max_len, seg0, n_seg,
                          BLOCK_H, TILE, PAGE, DV, QLEN, PLAN)),
            (_seesaw_producer, (kv_desc, pe_desc, q_desc, qpe_desc, kv_smem, pe_smem, q_smem,
                                qpe_smem, ready, empty, q_bar, q_free, bt_row, start, end,
                                n_tiles, num_pages, oob_row, pid_h, heads, WP, SL, BT,
                                stride_btb, max_len, seg0, n_seg, TILE, PAGE, STAGES,
                                BLOCK_H, QLEN, PLAN)),
        ], [4, 1], [240, 24])  # SEESAW_WG_REGS, SEESAW_COPY_WARP_REGS


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


def is_fp8(kv_cache) -> bool:
    return kv_cache.dtype == torch.float8_e4m3fn


def seesaw(kv_fp8: bool) -> bool:
    """Whether the stage 1 runs as the seesaw: a bf16 latent, at every page size (its
    stages released in parts, so the second stage's copy starts before the pair ends)."""
    return not kv_fp8


def launch_options(kv_fp8: bool) -> dict:
    """The stage 1's launch options: its warps (the seesaw's first warpgroup, its default
    partition; else both warpgroups) and ``maxnreg`` (:data:`MAXNREG`)."""
    return {"num_warps": 4 if seesaw(kv_fp8) else 8, "maxnreg": MAXNREG}


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
            TensorDescriptor(flat_k, [rows, DV], [kstride, 1],
                             [page, DV if is_fp8(kv_cache) else 64],
                             _cache_layout(kv_cache, DV, page)),
            TensorDescriptor(flat_k[DV:], [rows, DPE], [kstride, 1], [page, DPE],
                             _cache_layout(kv_cache, DPE, page)), q2)


def stage1_launch_args(q, kv_cache, block_table, seq_lens, scale, num_kv_splits, po, pl,
                       grid_splits=None, k_scale=None, v_scale=None, wp=None, parts_rows=None):
    """(grid, positional args, constexpr kwargs) of the Gluon stage 1: grid
    ``(cdiv(QLEN * H, 64), B, grid_splits)``, partials ``po``
    ``[B, QLEN * H, grid_splits, 512]`` and ``pl`` ``[B, QLEN * H, grid_splits]`` (row
    ``head * QLEN + token``); ``grid_splits`` (default ``num_kv_splits``) above
    ``num_kv_splits`` balances ragged lengths. An fp8 latent (``KV_FP8``) is dequantized
    with ``k_scale`` / ``v_scale`` (one-element fp32 device tensors) when given. With a
    work plan (work_plan.py: ``wp`` its buffer, ``parts_rows`` its per-part rows): grid
    ``(cdiv(QLEN * H, 64), parts, 1)``, one persistent program per part and row block, and
    partials ``[1, QLEN * H, slots, 512]`` / ``[1, QLEN * H, slots]``."""
    grid_splits = grid_splits or num_kv_splits
    b, t, h, _ = q_dims(q)
    page = kv_cache.shape[1]
    qd, qpd, kd, ped, _ = descriptors(q, kv_cache)
    scaled = k_scale is not None
    planned = wp is not None
    args = (qd, qpd, kd, ped, block_table, seq_lens, po, pl,
            k_scale if scaled else seq_lens, v_scale if scaled else seq_lens,
            wp if planned else seq_lens, parts_rows if planned else seq_lens,
            float(scale) * LOG2E, block_table.shape[1] * page, kv_cache.shape[0], h,
            block_table.stride(0), 0 if planned else po.stride(0), po.stride(1),
            po.stride(2), 0 if planned else pl.stride(0), pl.stride(1))
    kw = {"NUM_KV_SPLITS": num_kv_splits, "BLOCK_H": BLOCK_H, "PAGE": page, "DV": DV,
          "DPE": DPE, "QLEN": t, "BLOCK_N": BLOCK_N, "GRID_SPLITS": grid_splits,
          "KV_FP8": is_fp8(kv_cache), "KV_SCALED": scaled, "PLAN": planned}
    rows = -(-(t * h) // BLOCK_H)
    return ((rows, parts_rows.shape[0] // 2, 1) if planned else (rows, b, grid_splits)), args, kw


def gluon_call(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_table: torch.Tensor, seq_lens: torch.Tensor, sliding_window: Any,
               logit_cap: float, config: Any) -> bool:
    """Whether this call can run the Gluon stage 1 of ``config``: a GPU (not the
    interpreter), a bf16 q (3-D or 4-D) whose (request, token, head) rows share one row
    stride (TMA reads a tile's rows as one box), a bf16 or float8_e4m3fn latent of
    16/32/64-token pages whose 576-wide rows are contiguous, 16-byte aligned and packed
    page after page (TMA copies a page as one box), unit-stride block-table rows and
    lengths, no window, no logit cap, and the Gluon tile itself (or the narrow fp8 tile:
    ``gluon_mla_narrow``, an fp8 latent of at most 16 rows a request)."""
    if interpreting() or not q.is_cuda or sliding_window is not None or logit_cap > 0:
        return False
    _, t, h, _ = q_dims(q)
    if config not in (gluon_config(int(config.num_kv_splits), bool(config.plan)),
                      narrow_config(int(config.num_kv_splits), t * h)):
        return False
    if config.block_h < BLOCK_H and not is_fp8(k_cache):  # the narrow tile: fp8 only
        return False
    rows, page = k_cache.stride(1), k_cache.shape[1]
    return (q.dtype == torch.bfloat16 and k_cache.dtype in GLUON_CACHE_DTYPES
            and shares_latent(k_cache, v_cache) and q_rows_uniform(q)
            and page in GLUON_PAGE_SIZES and tuple(k_cache.shape[2:]) == (1, GLUON_HEAD_DIMS[0])
            and v_cache.shape[3] == GLUON_HEAD_DIMS[1] and k_cache.stride(3) == 1
            and k_cache.stride(0) == page * rows and rows * k_cache.element_size() % 16 == 0
            and k_cache.data_ptr() % 16 == 0 and k_cache.shape[0] * page < 2**31
            and block_table.stride(1) == 1 and seq_lens.stride(0) == 1)
