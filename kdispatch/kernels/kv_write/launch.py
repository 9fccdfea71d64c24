"""Launching ``kv_write``: the launch plan, the explicit-config launcher and the cached path.

:func:`plan` is the constexpr mapping (config and shapes -> grid, constexprs, options) and
:func:`runtime_args` the argument order; both are hashed into the op's source hash.
:func:`write_kv` is what the public function and the torch op call: the first call of a
signature (shapes, strides, dtypes, devices, pointer alignment, scale tensors, config)
checks the inputs,
resolves the config and launches through Triton's JIT; later calls of that signature
launch the compiled kernel directly (:mod:`kdispatch.launching`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import triton

from kdispatch import dispatcher as _dispatch
from kdispatch.dtypes import FP8_MAX
from kdispatch.kernels._common import interpreting, quantize_fp8, supports_pdl, tensor_sig
from kdispatch.kernels.kv_write.checks import check_inputs
from kdispatch.kernels.kv_write.kernel import _kv_write_kernel
from kdispatch.kernels.kv_write.spec import KVWriteConfig
from kdispatch.launching import (KernelLaunch, hooks_installed,
                                 make_direct, raw_stream)
from kdispatch.tensor_guard import layout_guard

OP_NAME = "kv_write"
_CACHE_LIMIT = 4096
#: the kernel's pointer arguments (before :func:`runtime_args`)
N_POINTERS = 9


@dataclass(frozen=True)
class Plan:
    grid: tuple[int, int]
    constexprs: dict[str, Any]
    options: dict[str, Any]


def plan(config: KVWriteConfig, num_tokens: int, num_heads: int, head_dim: int,
         page_size: int, has_mask: bool, has_active: bool, cache_dtype: str = "bfloat16",
         scaled: bool = False) -> Plan:
    """Grid, constexprs and launch options of the fused writer for ``config``.

    ``cache_dtype`` names the cache's dtype: an fp8 cache quantizes (``QUANT``), dividing
    by the scales when ``scaled``; the interpreter rounds to float8_e4m3fn in integer
    arithmetic (``SOFT_FP8``: its own fp32 -> fp8 cast is wrong), a GPU with its cast. On a
    GPU the division is a product by the scale's reciprocal with one fused correction
    (``FAST_DIV``: the same bits, no per-value division nor branch; the interpreter
    divides); on an NVIDIA GPU (``NVIDIA``) the reciprocal comes from its approximation
    instruction and the cast saturates by itself.
    """
    options: dict[str, Any] = {"num_warps": config.num_warps}
    if config.pdl:
        options["launch_pdl"] = True
    quant = cache_dtype in FP8_MAX
    return Plan(
        grid=(triton.cdiv(num_tokens, config.block_t), triton.cdiv(num_heads, config.block_h)),
        constexprs=dict(NUM_HEADS=num_heads, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
                        BLOCK_T=config.block_t, BLOCK_H=config.block_h,
                        BLOCK_D=triton.next_power_of_2(head_dim), HAS_MASK=has_mask,
                        HAS_ACTIVE=has_active, USE_PDL=config.pdl, QUANT=quant,
                        SCALED=quant and scaled, FP8_MAX=FP8_MAX.get(cache_dtype, 0.0),
                        SOFT_FP8=quant and interpreting() and cache_dtype == "float8_e4m3fn",
                        FAST_DIV=quant and scaled and not interpreting(),
                        NVIDIA=quant and not interpreting() and not torch.version.hip),
        options=options)


def runtime_args(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                 row_mask: torch.Tensor | None) -> tuple[int, ...]:
    """The kernel's non-pointer runtime arguments, after its ``N_POINTERS`` pointers."""
    return (key.shape[0], key_cache.shape[0] * key_cache.shape[1],
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            slot_mapping.stride(0), row_mask.stride(0) if row_mask is not None else 0)


def _indexed_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                   k_scale: Any = None, v_scale: Any = None) -> None:
    """The baseline: one torch indexed assignment for K and one for V (slots must be >= 0);
    into an fp8 cache the rows are quantized by torch first."""
    for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        if cache.dtype != src.dtype:
            src = quantize_fp8(src, scale, cache.dtype)
        num_blocks, page_size, num_heads, head_dim = cache.shape
        if page_size == 1 or cache.stride(0) == page_size * cache.stride(1):
            cache.view(num_blocks * page_size, num_heads, head_dim)[slot_mapping] = src
        else:  # blocks and offsets are not one mergeable dim: index them separately
            cache[slot_mapping // page_size, slot_mapping % page_size] = src


def launches(config: Any, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, slot_mapping: torch.Tensor, row_mask: Any,
             active_rows: Any, k_scale: Any = None,
             v_scale: Any = None) -> tuple[Plan | None, list[KernelLaunch]]:
    """The fused writer's launch for these inputs as data (none for the indexed baseline
    or zero rows)."""
    num_tokens, num_heads, head_dim = key.shape
    if config.variant == "indexed":
        if row_mask is not None or active_rows is not None:
            raise ValueError("config: the indexed variant cannot apply row_mask/active_rows "
                             "without a host sync; use variant='fused'")
        return None, []
    if config.pdl and not supports_pdl(key.device):
        raise ValueError("config: pdl=True needs an NVIDIA GPU of compute capability 9.0 or "
                         f"newer; {key.device} has none")
    if num_tokens == 0:
        return None, []
    p = plan(config, num_tokens, num_heads, head_dim, key_cache.shape[1],
             row_mask is not None, active_rows is not None,
             str(key_cache.dtype).removeprefix("torch."), k_scale is not None)
    # unused pointers get a harmless stand-in; the constexpr flags keep them unread
    mask_arg = row_mask.view(torch.uint8) if row_mask is not None else slot_mapping
    active_arg = active_rows if active_rows is not None else slot_mapping
    ks_arg = k_scale if k_scale is not None else slot_mapping
    vs_arg = v_scale if v_scale is not None else slot_mapping
    args = (key, value, key_cache, value_cache, slot_mapping, mask_arg, active_arg, ks_arg,
            vs_arg, *runtime_args(key, value, key_cache, value_cache, slot_mapping, row_mask))
    return p, [KernelLaunch(_kv_write_kernel, p.grid, args, p.constexprs, p.options)]


def _start(config: Any, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
           value_cache: torch.Tensor, slot_mapping: torch.Tensor, row_mask: Any,
           active_rows: Any, k_scale: Any, v_scale: Any) -> tuple[Plan | None, Any]:
    """Launch once through the JIT (or run the indexed baseline); (plan, compiled kernel)."""
    p, todo = launches(config, key, value, key_cache, value_cache, slot_mapping, row_mask,
                       active_rows, k_scale, v_scale)
    if config.variant == "indexed":
        if key.shape[0]:
            _indexed_write(key, value, key_cache, value_cache, slot_mapping, k_scale,
                           v_scale)
        return None, None
    compiled = None
    with torch.cuda.device(key.device) if key.is_cuda else nullcontext():
        for launch in todo:
            compiled = launch.run()
    return p, compiled


def launch_kv_write(config: KVWriteConfig, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, row_mask: torch.Tensor | None = None,
                    active_rows: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> None:
    """Write ``key``/``value`` rows into the paged caches in place, with an explicit config.

    Parameters
    ----------
    config : KVWriteConfig
        ``variant="fused"`` (one Triton launch) or ``"indexed"`` (two torch indexed
        assignments; no ``row_mask``/``active_rows``, and every slot must be >= 0).
    key, value : Tensor ``[T, H, D]``
        float32, float16 or bfloat16; any strides with a contiguous last dim.
    key_cache, value_cache : Tensor ``[num_blocks, page_size, H, D]``
        ``key``'s dtype, or both ``float8_e4m3fn`` (``float8_e4m3fnuz`` on AMD GPUs);
        ``key``'s device; contiguous last dim, otherwise any strides.
    slot_mapping : int32 or int64 Tensor ``[T]``
        ``block * page_size + offset``; a negative slot (or one past the cache) skips the
        row. Written slots must be unique (which of two rows writing one slot wins is
        unspecified).
    row_mask : bool Tensor ``[T]``, optional
        Rows with False are skipped.
    active_rows : int32 Tensor with one element, optional
        Only rows ``t < active_rows[0]`` are written.
    k_scale, v_scale : float32 Tensor with one element, optional
        fp8 caches only (both or neither): rows are stored as ``x / scale`` rounded to
        nearest even, saturating at the format's largest value (1.0 when not given).

    Raises
    ------
    ValueError
        Naming the argument, for a malformed input or a config that cannot serve it.
    """
    if not isinstance(config, KVWriteConfig):
        raise ValueError(f"config: expected a KVWriteConfig, got {type(config).__name__}")
    check_inputs(key, value, key_cache, value_cache, slot_mapping, row_mask, active_rows,
                 k_scale, v_scale)
    _start(config, key, value, key_cache, value_cache, slot_mapping, row_mask, active_rows,
           k_scale, v_scale)


class _Entry:
    """One checked call signature: its config, where it came from, its direct launch, and
    (once it serves a second call) its fast check (see :func:`_fast_check`)."""

    __slots__ = ("config", "resolved", "dispatcher", "direct", "plan", "tail", "fast",
                 "scaled", "device")

    def __init__(self, config: Any, resolved: Any, dispatcher: Any, direct: Any,
                 plan: Plan | None, tail: tuple[int, ...]):
        self.config, self.resolved, self.dispatcher = config, resolved, dispatcher
        self.direct, self.plan, self.tail = direct, plan, tail
        self.fast: Any = None  # None: not built yet; False: none can be
        self.scaled, self.device = False, -1


_CACHE: dict[Any, _Entry] = {}
#: the entry the last call served through its signature, when it has a fast check
_FAST: _Entry | None = None


def _fast_check(e: _Entry, tensors: tuple[Any, ...], device: int) -> None:
    """Give ``e`` one C++ check of the call's tensors (type, device, dtype, shape, strides:
    what its signature holds besides pointer alignment, which the fast path compares
    itself) and make it the fast path's entry. Only for entries with a direct launch and
    no row mask, active rows or explicit config (a plain or scaled write)."""
    global _FAST
    if e.fast is None:
        e.fast = layout_guard(*tensors) or False
        e.scaled, e.device = len(tensors) == 7, device
    if e.fast is not False:
        _FAST = e


def write_kv(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any,
             row_mask: Any = None, active_rows: Any = None, config: Any = None,
             k_scale: Any = None, v_scale: Any = None) -> _Entry | None:
    """The cached path of the public :func:`kdispatch.write_kv` (see its docstring); the
    signature's entry it served the call through (None: a call that was not cached).

    The fast path: the last signature's entry checks the call's tensors in one C++ check
    (~0.5 us where building the signature costs ~2.5) and its pointers' 16-byte alignment
    (the entry's are all aligned); anything else goes through the signature."""
    f = _FAST
    if (f is not None and row_mask is None and active_rows is None and config is None
            and f.dispatcher is _dispatch._DISPATCHER and not hooks_installed()):
        try:
            if (f.fast(key, value, key_cache, value_cache, slot_mapping)
                    if k_scale is None and v_scale is None
                    else f.scaled and f.fast(key, value, key_cache, value_cache,
                                             slot_mapping, k_scale, v_scale)):
                kp, vp = key.data_ptr(), value.data_ptr()
                kcp, vcp, sp = (key_cache.data_ptr(), value_cache.data_ptr(),
                                slot_mapping.data_ptr())
                ksp = vsp = sp
                if k_scale is not None:
                    ksp, vsp = k_scale.data_ptr(), v_scale.data_ptr()
                if not (kp | vp | kcp | vcp | sp | ksp | vsp) & 15:
                    if f.resolved is not None:
                        f.resolved.calls += 1
                    f.direct(raw_stream(f.device), kp, vp, kcp, vcp, sp, sp, sp, ksp, vsp,
                             *f.tail)
                    return f
        except Exception:  # noqa: BLE001 - a tensor given twice, or not a tensor: the
            pass           # signature path checks and names it
    try:
        kp, vp = key.data_ptr(), value.data_ptr()
        kcp, vcp, sp = key_cache.data_ptr(), value_cache.data_ptr(), slot_mapping.data_ptr()
        dev = key.get_device()
        sig = (key.shape, key.stride(), key.dtype, dev, value.shape, value.stride(),
               value.dtype, value.get_device(), key_cache.shape, key_cache.stride(),
               key_cache.dtype, key_cache.get_device(), value_cache.shape, value_cache.stride(),
               value_cache.dtype, value_cache.get_device(), slot_mapping.shape,
               slot_mapping.stride(), slot_mapping.dtype, slot_mapping.get_device(),
               kp & 15, vp & 15, kcp & 15, vcp & 15, sp & 15,
               tensor_sig(row_mask), tensor_sig(active_rows), tensor_sig(k_scale),
               tensor_sig(v_scale), None if config is None else id(config))
        e = _CACHE.get(sig)
    except (AttributeError, TypeError):  # not tensors, or an unhashable config
        e, sig = None, None
    if (e is not None and e.dispatcher is _dispatch._DISPATCHER
            and (config is None or e.config is config)):
        if e.resolved is not None:
            e.resolved.calls += 1
        if e.direct is not None and not hooks_installed():
            if (e.fast is not False and row_mask is None and active_rows is None
                    and config is None and (k_scale is None) == (v_scale is None)
                    and not (kp | vp | kcp | vcp | sp) & 15):
                _fast_check(e, (key, value, key_cache, value_cache, slot_mapping)
                            if k_scale is None else (key, value, key_cache, value_cache,
                                                     slot_mapping, k_scale, v_scale), dev)
            e.direct(raw_stream(dev), kp, vp, kcp, vcp, sp,
                     sp if row_mask is None else row_mask.data_ptr(),
                     sp if active_rows is None else active_rows.data_ptr(),
                     sp if k_scale is None else k_scale.data_ptr(),
                     sp if v_scale is None else v_scale.data_ptr(), *e.tail)
        elif e.plan is not None or e.config.variant == "indexed":
            _start(e.config, key, value, key_cache, value_cache, slot_mapping, row_mask,
                   active_rows, k_scale, v_scale)
        return e
    return _first_call(sig, key, value, key_cache, value_cache, slot_mapping, row_mask,
                       active_rows, config, k_scale, v_scale)


def _first_call(sig: Any, key: Any, value: Any, key_cache: Any, value_cache: Any,
                slot_mapping: Any, row_mask: Any, active_rows: Any, config: Any,
                k_scale: Any, v_scale: Any) -> _Entry | None:
    check_inputs(key, value, key_cache, value_cache, slot_mapping, row_mask, active_rows,
                 k_scale, v_scale)
    d = _dispatch.dispatcher()
    args = {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
            "slot_mapping": slot_mapping, "row_mask": row_mask, "active_rows": active_rows}
    cfg, resolved = d.resolve_entry(OP_NAME, args, config)
    p, compiled = _start(cfg, key, value, key_cache, value_cache, slot_mapping, row_mask,
                         active_rows, k_scale, v_scale)
    if sig is None:
        return None
    direct = None
    if p is not None:  # make_direct says None where direct launches are off
        direct = make_direct(_kv_write_kernel, compiled, p.grid, N_POINTERS + 14)
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    tail = runtime_args(key, value, key_cache, value_cache, slot_mapping, row_mask)
    e = _CACHE[sig] = _Entry(cfg, resolved, d, direct, p, tail)
    return e
