"""Launching ``decode_attention``: the launch plan, the explicit-config launcher, the cached path.

:func:`plan` is the constexpr mapping (config and shapes -> stage-1 kernel, grids,
constexprs, workspace) and :func:`stage1_args` / :func:`reduce_args` the argument order;
they are hashed into the op's source hash. :func:`decode_attention` is what the public
function and the torch op call: the first call of a signature (shapes, strides, dtypes,
devices, pointer alignment, whether v aliases k, the scale tensors, the flags and the
config) checks the inputs, resolves the config and launches through Triton's JIT; later
calls of that signature allocate the output and one partials buffer and launch the
compiled kernels directly (:mod:`kdispatch.launching`), passing the scale tensors'
pointers (their values are read by the kernel).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import triton

from kdispatch import dispatcher as _dispatch
from kdispatch.device import Device
from kdispatch.kernels._common import FP8_TORCH_DTYPES, interpreting, supports_pdl, tensor_sig
from kdispatch.kernels.decode_attention.checks import check_call, q_dims, shares_latent
from kdispatch.kernels.decode_attention.gluon_mla import (BLOCK_H, _gluon_mla_stage1,
                                                          gluon_call, launch_options,
                                                          stage1_launch_args)
from kdispatch.kernels.decode_attention.gluon_mla_narrow import (_narrow_stage1, narrow_args,
                                                                 narrow_constexprs)
from kdispatch.kernels.decode_attention.kernels import _decode_reduce, _decode_stage1
from kdispatch.kernels.decode_attention.spec import grid_splits, resident_per_sm, tile_smem
from kdispatch.kernels.decode_attention.latent import _decode_stage1_latent
from kdispatch.kernels.decode_attention.work_plan import (plan_buffer, plan_items, plan_launch,
                                                          plan_parts, plan_views)
from kdispatch.kernels.decode_attention.zero_row import _ZERO_ROWS, zero_row
from kdispatch.launching import KernelLaunch, hooks_installed, make_direct, raw_stream
from kdispatch.tensor_guard import layout_guard

OP_NAME = "decode_attention"
LOG2E = 1.4426950408889634
#: splits merged per iteration of the reduce
REDUCE_SPLIT_CHUNK = 8
#: a shared latent at least this wide (and a power of two) runs ``_decode_stage1_latent``
#: (two half-width tiles); measured on the H200 at DV 512 only (docs/decode_notes.md v3)
SPLIT_LATENT_MIN_DV = 512
_CACHE_LIMIT = 4096


def _p2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _splits_p2(splits: int) -> int:
    """The merge's and the reduce's split axis: the count to a power of two, >= 16."""
    return max(16, _p2(splits))


def reduce_shape(heads: int, dv: int) -> tuple[int, int]:
    """``(BLOCK_DV, num_warps)`` of the reduce for ``heads`` q heads: one warp over up to 128
    columns, four over 512 from 64 heads on; from the head count only, so a request's bits
    do not depend on its batch. H200 (decode_notes v6), against one 4-warp program per 128
    columns: deepseek TP8 b32 (8 splits) 3.7 vs 8.6 us, kimi b8 (33) 4.1 vs 6.9, kimi b1
    (132) 7.8 vs 8.2, TP1 (128 heads) 7.6 vs 50 us."""
    block_dv = min(_p2(dv), 512 if heads >= 64 else 128)
    return block_dv, max(1, block_dv // 128)


@dataclass(frozen=True)
class Plan:
    """Everything a launch of one config at one signature needs besides the tensors."""

    latent: bool                 # stage 1 is _decode_stage1_latent (no V pointer)
    grid: tuple[int, int, int]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    reduce_grid: tuple[int, int, int] | None
    reduce_constexprs: dict[str, Any] | None
    reduce_options: dict[str, Any] | None
    out_shape: tuple[int, ...]   # (b, hq, dv), or (b, q_len, hq, dv) for a 4-D q
    # (b, hq * q_len, splits, dv) fp32 (row = head * q_len + token), or None
    partials_shape: tuple[int, int, int, int] | None
    counters_shape: tuple[int, int] | None            # merge arrival counters, or None
    log2e_scale: float                                # multiplies ``scale`` into qk_scale
    capped: bool
    gluon: bool = False          # stage 1 is the Gluon kernel (always split into partials)
    narrow: bool = False         # ... its narrow fp8 tile (gluon_mla_narrow)
    plan_parts: int = 0          # the Gluon stage 1's work plan: its parts (0: none)


def plan(config: Any, b: int, hq: int, dk: int, page: int, hk: int, dv: int, shared: bool,
         q_float32: bool, sliding: bool, capped: bool, q_len: int = 1, q4d: bool = False,
         kv_fp8: bool = False, scaled: bool = False, gluon: bool = False,
         table_tokens: int = 0, balance: bool = False, cu_count: int = 0) -> Plan:
    """Kernel choice, grids, constexprs and workspace of ``config`` at these shapes.

    ``q_len`` new tokens per request (``q4d``: q and out are 4-D); a tile's rows are the
    ``q_len x group`` (token, head) pairs of one kv head. ``kv_fp8``: the cache is fp8,
    dequantized in the kernel (with the scale tensors when ``scaled``) into fp16 dots
    (``F16_DOTS``, interpreter included: it does fp16 dots right) unless q is fp32.
    ``gluon``: stage 1 is the Gluon kernel, which always writes partials for the reduce.
    ``balance``: a balanced split grid (:func:`spec.grid_splits`; ``table_tokens`` wide
    tables, ``cu_count`` SMs, 0 if unknown) for batches whose stage 1 writes partials, but
    not the Triton latent 64-row tile (the length scan made ptxas spill 264-268 B there).
    """
    if gluon:
        if config.plan:  # a persistent program per part of the device's work plan
            return _gluon_plan(config, b, hq, dv, q_len, q4d, page, 0, kv_fp8,
                               kv_fp8 and scaled, plan_parts(int(config.num_kv_splits),
                                                             cu_count, q_len * hq))
        g = (grid_splits(int(config.num_kv_splits), b, hq * q_len, dv, table_tokens,
                         int(config.block_n)) if balance and b > 1 else 0)
        return _gluon_plan(config, b, hq, dv, q_len, q4d, page, g, kv_fp8, kv_fp8 and scaled)
    group = hq // hk
    block_h = int(config.block_h)
    head_blocks = triton.cdiv(q_len * group, block_h)
    splits = int(config.num_kv_splits)
    block_d = max(16, _p2(dv))
    dpe = dk - dv
    direct = splits == 1
    pdl = bool(config.pdl) and not direct
    merge = bool(config.merge) and not direct
    latent = shared and dv == block_d and dv >= SPLIT_LATENT_MIN_DV
    g = splits
    if balance and b > 1 and not direct and not (latent and block_h >= 64):
        size = 4 if q_float32 else 2
        smem = tile_smem(1 if kv_fp8 else size, size, dk, dv, shared, kv_fp8,
                         int(config.block_n), block_h, int(config.num_stages))
        g = grid_splits(splits, b, hq * q_len, dv, table_tokens, int(config.block_n),
                        b * hk * head_blocks, resident_per_sm(smem), cu_count)
    constexprs = dict(
        GROUP=group, PAGE=page, DV=dv, DPE=dpe, BLOCK_D=block_d,
        BLOCK_DPE=max(16, _p2(dpe)) if dpe > 0 else 0, BLOCK_N=int(config.block_n),
        BLOCK_H=block_h, HEAD_BLOCKS=head_blocks, NUM_KV_SPLITS=splits, SLIDING=sliding,
        LOGIT_CAP=capped, UPCAST=interpreting() and not q_float32 and not kv_fp8,
        DIRECT=direct,
        PREC="ieee" if q_float32 else "tf32", USE_PDL=pdl, MERGE=merge,
        BLOCK_C=min(block_d, 128), SPLITS_P2=_splits_p2(g), QLEN=q_len, KV_FP8=kv_fp8,
        KV_SCALED=kv_fp8 and scaled, F16_DOTS=kv_fp8 and not q_float32,
        ASM_CVT=kv_fp8 and not q_float32 and not interpreting() and not torch.version.hip,
        GRID_SPLITS=g)
    if not latent:
        constexprs["SHARED_KV"] = shared
    reduce = (dict(reduce_grid=None, reduce_constexprs=None, reduce_options=None)
              if direct or merge else _reduce_plan(config, b, hq, dv, q_len, sliding, pdl, g))
    return Plan(
        latent=latent, grid=(hk * head_blocks, b, g), constexprs=constexprs,
        options={"num_warps": int(config.num_warps), "num_stages": int(config.num_stages)},
        **reduce, out_shape=(b, q_len, hq, dv) if q4d else (b, hq, dv),
        partials_shape=None if direct else (b, hq * q_len, g, dv),
        counters_shape=(b, hk * head_blocks) if merge else None,
        log2e_scale=1.0 if capped else LOG2E, capped=capped)


def _reduce_plan(config: Any, b: int, hq: int, dv: int, q_len: int, sliding: bool,
                 pdl: bool, g: int) -> dict[str, Any]:
    """The :class:`Plan` fields (``reduce_grid``, ``reduce_constexprs``, ``reduce_options``)
    of the reduce that merges ``config``'s split partials (``g`` of them per row)."""
    splits = int(config.num_kv_splits)
    block_dv, reduce_warps = reduce_shape(hq, dv)
    constexprs = dict(DV=dv, BLOCK_DV=block_dv, BLOCK_N=int(config.block_n),
                      NUM_KV_SPLITS=splits, SPLITS_P2=_splits_p2(g),
                      SPLIT_CHUNK=REDUCE_SPLIT_CHUNK, SLIDING=sliding, USE_PDL=pdl, QLEN=q_len,
                      GRID_SPLITS=g)
    options = {"num_warps": reduce_warps, "num_stages": 2}
    if pdl:
        options["launch_pdl"] = True
    return dict(reduce_grid=(hq * q_len, triton.cdiv(dv, block_dv), b),
                reduce_constexprs=constexprs, reduce_options=options)


def _gluon_plan(config: Any, b: int, hq: int, dv: int, q_len: int, q4d: bool,
                page: int = 64, g: int = 0, kv_fp8: bool = False,
                scaled: bool = False, parts: int = 0) -> Plan:
    """The Gluon stage 1 (``config.block_h`` (token, head) rows of one request a program:
    64, or the narrow fp8 tile's 16 or 32; 64-token tiles of ``64 // page`` pages; an fp8
    latent with its scales when ``scaled``) and the reduce, over ``g`` grid splits (0: the
    config's count); with ``parts``, one persistent program per part of a work plan."""
    splits = int(config.num_kv_splits)
    g = g or splits
    items = plan_items(parts, b) if parts else 0
    reduce = _reduce_plan(config, b, hq, dv, q_len, False, False, parts or g)
    if parts:
        reduce["reduce_constexprs"]["PLAN"] = True
    narrow = int(config.block_h) < BLOCK_H  # the narrow fp8 tile: 16 or 32 rows, one program
    return Plan(
        latent=True, grid=(triton.cdiv(q_len * hq, int(config.block_h)), parts or b,
                           1 if parts else g),
        constexprs=narrow_constexprs(splits, g, int(config.block_h), page, q_len, scaled,
                                     int(config.num_stages)) if narrow else
        dict(NUM_KV_SPLITS=splits, BLOCK_H=int(config.block_h), PAGE=page, DV=dv, DPE=64,
             QLEN=q_len, BLOCK_N=int(config.block_n), GRID_SPLITS=g, KV_FP8=kv_fp8,
             KV_SCALED=scaled, PLAN=bool(parts)),
        options={"num_warps": int(config.num_warps)} if narrow else launch_options(kv_fp8),
        **reduce,
        out_shape=(b, q_len, hq, dv) if q4d else (b, hq, dv),
        partials_shape=(1, hq * q_len, items, dv) if parts else (b, hq * q_len, g, dv),
        counters_shape=None, log2e_scale=LOG2E, capped=False, gluon=True, plan_parts=parts,
        narrow=narrow)


def _partials_strides(p: Plan) -> tuple[int, ...]:
    if p.partials_shape is None:
        return (0, 0, 0, 0, 0)
    _, hq, splits, dv = p.partials_shape
    return (hq * splits * dv, splits * dv, dv, hq * splits, splits)


def _btd_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) strides of a ``[B, Hq, D]`` or ``[B, Q, Hq, D]`` tensor (token
    stride 0 for the 3-D form: its one token)."""
    if t.dim() == 3:
        return t.stride(0), 0, t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def stage1_args(p: Plan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
                window: int) -> tuple[int, ...]:
    """Stage 1's integer runtime arguments after its pointers and two float scalars."""
    kv = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    if not p.latent:
        kv += (v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
    cnt_stride = p.counters_shape[1] if p.counters_shape is not None else 0
    return (window, block_table.shape[1] * k_cache.shape[1], k_cache.shape[0],
            *_btd_strides(q), *kv,
            block_table.stride(0), block_table.stride(1), seq_lens.stride(0),
            *_btd_strides(out), *_partials_strides(p), cnt_stride)


def reduce_args(p: Plan, k_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens: torch.Tensor, out: torch.Tensor, window: int) -> tuple[int, ...]:
    """The reduce's integer runtime arguments after its four pointers."""
    return (window, block_table.shape[1] * k_cache.shape[1], seq_lens.stride(0),
            *_partials_strides(p), *_btd_strides(out))


def _partials_layout(p: Plan) -> tuple[int, int]:
    """(elements of the partial outputs padded to 16, total fp32 elements) of one buffer
    that holds the partial outputs and then their lse (kept 64-byte aligned)."""
    b, hq, splits, dv = p.partials_shape  # type: ignore[misc]
    n_po_pad = -(-(b * hq * splits * dv) // 16) * 16
    return n_po_pad, n_po_pad + b * hq * splits


def _workspace(p: Plan, q: torch.Tensor) -> tuple[Any, Any, Any]:
    """(partials, lse, counters) tensors; None where the plan has none."""
    if p.partials_shape is None:
        return None, None, None
    b, hq, splits, dv = p.partials_shape
    n_po_pad, total = _partials_layout(p)
    buf = q.new_empty(total, dtype=torch.float32)
    po = buf[:b * hq * splits * dv].view(b, hq, splits, dv)
    pl = buf[n_po_pad:].view(b, hq, splits)
    cnt = (q.new_zeros(p.counters_shape, dtype=torch.int32)
           if p.counters_shape is not None else None)
    return po, pl, cnt


def launches(p: Plan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
             scale: float, logit_cap: float, window: int, k_scale: Any = None,
             v_scale: Any = None, zeros: Any = None) -> list[KernelLaunch]:
    """The plan's launches as data (stage 1, then the reduce when it has one), with a
    freshly allocated workspace (and, for a Triton stage 1, :func:`zero_row` unless
    ``zeros`` is given; the Gluon stage 1 reads none)."""
    po, pl, cnt = _workspace(p, q)
    out_launches, wp, sl, parts_rows = [], None, seq_lens, None
    if p.plan_parts:  # the work plan first; the reduce reads its per-request rows
        items = p.partials_shape[2]
        wp = plan_buffer(seq_lens, items, p.plan_parts)  # type: ignore
        out_launches.append(plan_launch(seq_lens, wp, block_table.shape[1] * k_cache.shape[1],
                                        p.plan_parts, items))
        sl, parts_rows = plan_views(wp, items, seq_lens.shape[0])
    if p.gluon:
        ks, vs = (k_scale, v_scale) if p.constexprs["KV_SCALED"] else (None, None)
        args = (narrow_args(q, k_cache, block_table, seq_lens, scale, po, pl, ks, vs)
                if p.narrow else
                stage1_launch_args(q, k_cache, block_table, seq_lens, scale,
                                   p.constexprs["NUM_KV_SPLITS"], po, pl,
                                   p.constexprs["GRID_SPLITS"], ks, vs, wp, parts_rows)[1])
        out_launches.append(KernelLaunch(_narrow_stage1 if p.narrow else _gluon_mla_stage1,
                                         p.grid, args, p.constexprs, p.options))
    else:
        zeros = zero_row(k_cache, v_cache) if zeros is None else zeros
        out_launches.append(_triton_stage1(p, q, k_cache, v_cache, block_table, seq_lens, out,
                                           scale, logit_cap, window, k_scale, v_scale, zeros,
                                           po, pl, cnt))
    if p.reduce_grid is not None:
        rargs = (sl, po, pl, out, *reduce_args(p, k_cache, block_table, sl, out, window))
        out_launches.append(KernelLaunch(_decode_reduce, p.reduce_grid, rargs,
                                         p.reduce_constexprs or {}, p.reduce_options or {}))
    return out_launches


def _triton_stage1(p: Plan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
                   scale: float, logit_cap: float, window: int, k_scale: Any, v_scale: Any,
                   zeros: Any, po: Any, pl: Any, cnt: Any) -> KernelLaunch:
    po_arg, pl_arg = (po if po is not None else out), (pl if pl is not None else out)
    cnt_arg = cnt if cnt is not None else pl_arg
    kv = (k_cache,) if p.latent else (k_cache, v_cache)
    # unscaled: a harmless stand-in pointer the KV_SCALED constexpr keeps unread
    ks_arg, vs_arg = ((k_scale, v_scale) if k_scale is not None else (seq_lens, seq_lens))
    args = (q, *kv, block_table, seq_lens, out, po_arg, pl_arg, cnt_arg, ks_arg, vs_arg,
            zeros, float(scale) * p.log2e_scale, float(logit_cap) if p.capped else 1.0,
            *stage1_args(p, q, k_cache, v_cache, block_table, seq_lens, out, window))
    kernel = _decode_stage1_latent if p.latent else _decode_stage1
    return KernelLaunch(kernel, p.grid, args, p.constexprs, p.options)


def _launch_jit(p: Plan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
                scale: float, logit_cap: float, window: int, k_scale: Any,
                v_scale: Any, zeros: Any = None) -> tuple[Any, Any]:
    """Run the plan through Triton's JIT; returns (stage-1, reduce) compiled kernels."""
    todo = launches(p, q, k_cache, v_cache, block_table, seq_lens, out, scale, logit_cap,
                    window, k_scale, v_scale, zeros)
    with torch.cuda.device(q.device) if q.is_cuda else nullcontext():
        compiled = [launch.run() for launch in todo]
    return compiled[0], compiled[1] if len(compiled) > 1 else None


def checked_plan(config: Any, q: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                  sliding_window: Any, logit_cap: float, k_scale: Any = None,
                  batch_invariant: bool = False) -> Plan:
    split = config.num_kv_splits > 1
    if split and bool(config.pdl) and bool(config.merge):
        raise ValueError("config: pdl and merge exclude each other (merge launches no reduce)")
    if split and bool(config.pdl) and not supports_pdl(q.device):
        raise ValueError("config: pdl=True needs an NVIDIA GPU of compute capability 9.0 or "
                         f"newer; {q.device} has none")
    b, q_len, hq, dk = q_dims(q)
    _, page, hk, _ = k_cache.shape
    gluon = config.kernel == "gluon"
    if gluon and not gluon_call(q, k_cache, v_cache, block_table, seq_lens, sliding_window,
                                logit_cap, config):
        # a call the Gluon tile cannot take (the interpreter, a logit cap, strides TMA
        # cannot address): the Triton latent stage 1 at the same tile and split count
        config, gluon = config.model_copy(update={"kernel": "triton", "plan": False}), False
    return plan(config, b, hq, dk, page, hk, v_cache.shape[3], shares_latent(k_cache, v_cache),
                q.dtype == torch.float32, sliding_window is not None, logit_cap > 0,
                q_len, q.dim() == 4, k_cache.dtype in FP8_TORCH_DTYPES,
                k_scale is not None, gluon, block_table.shape[1] * page, not batch_invariant,
                0 if interpreting() or not q.is_cuda else Device.from_torch(q.device).cu_count)


def planned_launches(config: Any, q: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     *, scale: float, out: torch.Tensor | None = None,
                     sliding_window: int | None = None, logit_cap: float = 0.0,
                     k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None,
                     batch_invariant: bool = False) -> list[KernelLaunch]:
    """What :func:`launch_decode_attention` would launch, as data (nothing runs)."""
    check_call(q, k_cache, v_cache, block_table, seq_lens, scale, out, sliding_window,
               logit_cap, k_scale, v_scale)
    p = checked_plan(config, q, k_cache, v_cache, block_table, seq_lens, sliding_window,
                     logit_cap, k_scale, batch_invariant)
    return launches(p, q, k_cache, v_cache, block_table, seq_lens,
                    q.new_empty(p.out_shape) if out is None else out, scale, logit_cap,
                    int(sliding_window or 0), k_scale, v_scale)


def launch_decode_attention(config: Any, q: torch.Tensor, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, block_table: torch.Tensor,
                            seq_lens: torch.Tensor, *, scale: float,
                            out: torch.Tensor | None = None,
                            sliding_window: int | None = None,
                            logit_cap: float = 0.0, k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None,
                            batch_invariant: bool = False) -> torch.Tensor:
    """Run decode attention with an explicit config (no dispatch, no caching).

    Parameters are those of :func:`kdispatch.decode_attention`; ``config`` is a
    ``DecodeConfig`` (``num_kv_splits``, ``block_n``, ``block_h``, ``num_warps``,
    ``num_stages``, ``pdl``, ``merge``). ``batch_invariant`` keeps each request's splits
    its own (no balanced grid), as the public function's flag does.
    """
    check_call(q, k_cache, v_cache, block_table, seq_lens, scale, out, sliding_window,
               logit_cap, k_scale, v_scale)
    p = checked_plan(config, q, k_cache, v_cache, block_table, seq_lens, sliding_window,
                     logit_cap, k_scale, batch_invariant)
    if out is None:
        out = q.new_empty(p.out_shape)
    _launch_jit(p, q, k_cache, v_cache, block_table, seq_lens, out, scale, logit_cap,
                int(sliding_window or 0), k_scale, v_scale)
    return out


class _Entry:
    """One checked call signature: its config and plan, and its direct launches (with their
    integer arguments and zero row; None for a Gluon plan, whose calls all go through
    Triton's JIT)."""

    __slots__ = ("config", "resolved", "dispatcher", "plan", "window", "stage1", "reduce",
                 "tail1", "tail2", "zeros", "fast", "options", "device")

    def __init__(self, **kw: Any):
        self.fast: Any = None  # the fast check (None: not built yet; False: none can be)
        self.options: Any = None  # (sliding_window, capped, batch_invariant, shared K/V)
        self.device = -1
        for k, v in kw.items():
            setattr(self, k, v)


_CACHE: dict[Any, _Entry] = {}
#: the entry the last call served through its signature, when it has a fast check
_FAST: _Entry | None = None


def _fast_tensors(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any,
                  out: Any, k_scale: Any, v_scale: Any) -> tuple[Any, ...]:
    """The tensors a fast check compares: the five, then ``out`` and the scales if given
    (a call that gives other ones is another count or order of tensors: refused)."""
    return (q, k_cache, v_cache, block_table, seq_lens,
            *(() if out is None else (out,)),
            *(() if k_scale is None and v_scale is None else (k_scale, v_scale)))


def _ptrs(out: Any, k_scale: Any, v_scale: Any) -> int:
    """The optional tensors' data pointers OR-ed (0 for none given): their alignment."""
    return ((0 if out is None else out.data_ptr()) | (0 if k_scale is None
            else k_scale.data_ptr()) | (0 if v_scale is None else v_scale.data_ptr()))


def _scalars_ok(scale: Any, logit_cap: Any) -> bool:
    """Whether a cached launch may take these scalars (anything else goes to the first
    call's checks, which name the argument)."""
    return (isinstance(scale, float | int) and math.isfinite(scale)
            and isinstance(logit_cap, float | int) and 0.0 <= logit_cap < math.inf)


def _fast_check(e: _Entry, tensors: tuple[Any, ...], options: tuple[Any, ...],
                device: int) -> None:
    """Give ``e`` one C++ check of the call's tensors (type, device, dtype, shape and
    strides: what its signature holds besides pointer alignment, a shared K/V pointer and
    the options, which the fast path compares itself) and make it the fast path's entry.
    Only entries with direct launches whose call had every pointer 16-byte aligned."""
    global _FAST
    if e.fast is None:
        e.fast = layout_guard(*tensors) or False
        e.options, e.device = options, device
    if e.fast is not False and e.options == options:
        _FAST = e


def _signature(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any,
               qp: int, kp: int, vp: int, bp: int, sp: int, dev: int, out: Any, k_scale: Any,
               v_scale: Any, sliding_window: Any, logit_cap: Any, batch_invariant: Any,
               config: Any) -> tuple[Any, ...]:
    """What a call's cache entry is keyed on (``qp`` ... ``sp``: the five data pointers)."""
    return (q.shape, q.stride(), q.dtype, dev, k_cache.shape, k_cache.stride(),
            k_cache.dtype, k_cache.get_device(), v_cache.shape, v_cache.stride(),
            v_cache.dtype, v_cache.get_device(), block_table.shape,
            block_table.stride(), block_table.dtype, block_table.get_device(),
            seq_lens.shape, seq_lens.stride(), seq_lens.dtype, seq_lens.get_device(),
            qp & 15, kp & 15, vp & 15, bp & 15, sp & 15, vp == kp, tensor_sig(out),
            tensor_sig(k_scale), tensor_sig(v_scale), sliding_window, logit_cap > 0,
            batch_invariant, None if config is None else id(config))


def cached_entry(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any,
                 out: Any = None) -> _Entry | None:
    """The current entry of a plain call (no options or scales) of these tensors."""
    ptrs = [t.data_ptr() for t in (q, k_cache, v_cache, block_table, seq_lens)]
    e = _CACHE.get(_signature(q, k_cache, v_cache, block_table, seq_lens, *ptrs,
                              q.get_device(), out, None, None, None, 0.0, False, None))
    return e if e is not None and e.dispatcher is _dispatch._DISPATCHER else None


def decode_attention(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any,
                     scale: float, out: Any = None, sliding_window: Any = None,
                     logit_cap: float = 0.0, batch_invariant: bool = False,
                     config: Any = None, k_scale: Any = None, v_scale: Any = None) -> Any:
    """The cached path of the public :func:`kdispatch.decode_attention`.

    The fast path: the last signature's entry checks the call's tensors in one C++ check
    (~0.5 us where building the signature costs ~2.5) and compares the rest of the
    signature itself (options, pointer alignment, a shared K/V pointer); anything else
    goes through the signature."""
    e = _FAST
    try:
        if (e is None or config is not None or e.dispatcher is not _dispatch._DISPATCHER
                or not (e.fast(q, k_cache, v_cache, block_table, seq_lens)
                        if out is None and k_scale is None and v_scale is None
                        else e.fast(*_fast_tensors(q, k_cache, v_cache, block_table,
                                                   seq_lens, out, k_scale, v_scale)))):
            raise LookupError
        qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
        bp, sp, dev = block_table.data_ptr(), seq_lens.data_ptr(), e.device
        if ((qp | kp | vp | bp | sp | _ptrs(out, k_scale, v_scale)) & 15
                or e.options != (sliding_window, logit_cap > 0, batch_invariant, vp == kp)
                or not _scalars_ok(scale, logit_cap)):
            raise LookupError
    except Exception:  # noqa: BLE001 - no fast entry, another call, or not tensors
        e = None       # (a tensor given twice: torch's check raises): the signature path
    if e is None:
        try:
            qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
            bp, sp = block_table.data_ptr(), seq_lens.data_ptr()
            dev = q.get_device()
            sig = _signature(q, k_cache, v_cache, block_table, seq_lens, qp, kp, vp, bp, sp,
                             dev, out, k_scale, v_scale, sliding_window, logit_cap,
                             batch_invariant, config)
            e = _CACHE.get(sig)
            scalars_ok = _scalars_ok(scale, logit_cap)
        except (AttributeError, TypeError):  # not tensors, or an unhashable argument
            e, sig, scalars_ok = None, None, False
        if (e is None or not scalars_ok or e.dispatcher is not _dispatch._DISPATCHER
                or (config is not None and e.config is not config)):
            return _first_call(sig, q, k_cache, v_cache, block_table, seq_lens, scale, out,
                               sliding_window, logit_cap, batch_invariant, config, k_scale,
                               v_scale)
        if (e.fast is not False and e.stage1 is not None and config is None
                and not (qp | kp | vp | bp | sp | _ptrs(out, k_scale, v_scale)) & 15):
            _fast_check(e, _fast_tensors(q, k_cache, v_cache, block_table, seq_lens, out,
                                         k_scale, v_scale),
                        (sliding_window, logit_cap > 0, batch_invariant, vp == kp), dev)
    if e.resolved is not None:
        e.resolved.calls += 1
    p = e.plan
    o = q.new_empty(p.out_shape) if out is None else out
    if e.stage1 is None or hooks_installed() or torch._C._cuda_getDevice() != dev:
        _launch_jit(p, q, k_cache, v_cache, block_table, seq_lens, o, scale, logit_cap,
                    e.window, k_scale, v_scale, e.zeros)
        return o
    stream = raw_stream(dev)
    op_ = o.data_ptr()
    po = pl = cnt = op_
    ws = counters = None
    if p.partials_shape is not None:
        ws = q.new_empty(e.tail2[0], dtype=torch.float32)
        po = ws.data_ptr()
        pl = cnt = po + e.tail2[1]
        if p.counters_shape is not None:
            counters = q.new_zeros(p.counters_shape, dtype=torch.int32)
            cnt = counters.data_ptr()
    qks = float(scale) * p.log2e_scale
    cap = float(logit_cap) if p.capped else 1.0
    ksp = sp if k_scale is None else k_scale.data_ptr()
    vsp = sp if v_scale is None else v_scale.data_ptr()
    if p.latent:
        e.stage1(stream, qp, kp, bp, sp, op_, po, pl, cnt, ksp, vsp, e.zeros.data_ptr(), qks,
                 cap, *e.tail1)
    else:
        e.stage1(stream, qp, kp, vp, bp, sp, op_, po, pl, cnt, ksp, vsp, e.zeros.data_ptr(),
                 qks, cap, *e.tail1)
    if e.reduce is not None:
        e.reduce(stream, sp, po, pl, op_, *e.tail2[2:])
    del ws, counters  # the caching allocator orders their reuse after these launches
    return o


def _first_call(sig: Any, q: Any, k_cache: Any, v_cache: Any, block_table: Any,
                seq_lens: Any, scale: Any, out: Any, sliding_window: Any, logit_cap: Any,
                batch_invariant: Any, config: Any, k_scale: Any,
                v_scale: Any) -> torch.Tensor:
    check_call(q, k_cache, v_cache, block_table, seq_lens, scale, out, sliding_window,
               logit_cap, k_scale, v_scale)
    d = _dispatch.dispatcher()
    args = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
            "seq_lens": seq_lens, "sliding_window": sliding_window,
            "batch_invariant": batch_invariant}
    cfg, resolved = d.resolve_entry(OP_NAME, args, config)
    p = checked_plan(cfg, q, k_cache, v_cache, block_table, seq_lens, sliding_window,
                     logit_cap, k_scale, batch_invariant)
    o = q.new_empty(p.out_shape) if out is None else out
    window = int(sliding_window or 0)
    zeros = None if p.gluon else zero_row(k_cache, v_cache)  # the Gluon stage 1 reads none
    first, second = _launch_jit(p, q, k_cache, v_cache, block_table, seq_lens, o, scale,
                                logit_cap, window, k_scale, v_scale, zeros)
    if sig is None or (zeros is not None
                       and _ZERO_ROWS.get((k_cache.device, k_cache.dtype)) is not zeros):
        return o  # a zero row made under graph capture is the graph's: cache nothing
    stage1 = reduce = tail1 = tail2 = None
    if not p.gluon:  # the Gluon stage 1 takes TMA descriptors: every call goes through its JIT
        tail1 = stage1_args(p, q, k_cache, v_cache, block_table, seq_lens, o, window)
        rargs = reduce_args(p, k_cache, block_table, seq_lens, o, window)
        ws_numel = pl_offset = 0
        if p.partials_shape is not None:
            n_po_pad, ws_numel = _partials_layout(p)
            pl_offset = n_po_pad * 4
        tail2 = (ws_numel, pl_offset, *rargs)
        if q.is_cuda:  # make_direct says None where direct launches are off
            kernel = _decode_stage1_latent if p.latent else _decode_stage1
            n_ptr = kernel.arg_names.index("qk_scale")  # the leading pointers
            stage1 = make_direct(kernel, first, p.grid, n_ptr + 2 + len(tail1))
            if p.reduce_grid is not None and stage1 is not None:
                reduce = make_direct(_decode_reduce, second, p.reduce_grid, 4 + len(rargs))
                if reduce is None:
                    stage1 = None
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[sig] = _Entry(config=cfg, resolved=resolved, dispatcher=d, plan=p, window=window,
                         stage1=stage1, reduce=reduce, tail1=tail1, tail2=tail2, zeros=zeros)
    return o
