"""Paged KV-cache writer (op ``kv_write``): scatter new K/V rows into a paged cache.

Layout: ``key``/``value`` are ``[T, H, D]`` with any strides and a contiguous last dim
(typically views into one qkv projection); the caches are ``[num_blocks, page_size, H, D]``
(the vLLM flash layout; K and V caches may have different strides). Row ``t`` goes to slot
``slot_mapping[t] = block * page_size + offset``. A negative slot (or one past the end of the
cache) skips the row, so do rows
with ``row_mask[t] == False`` and rows ``t >= active_rows[0]``. Every one of those values is
read on the device, so a captured CUDA graph honours new values on each replay; the grid and
every constexpr come from shapes and the config only.

Variants (the config's ``variant``):

- ``indexed``: two torch indexed assignments, the baseline. It cannot skip rows without a
  host sync, so it is valid only for unmasked keys, and its slots must all be >= 0.
- ``fused``: one Triton launch writing K and V; ``row_mask`` / ``active_rows`` select the
  masked and active-row forms through constexpr flags. Addresses are 64-bit, so a cache
  may exceed 2^31 elements.

With ``pdl`` (NVIDIA sm_90+), the fused writer is launched as a programmatic dependent
launch: it may be scheduled before the previous kernel on the stream has finished, waits
for it (``griddepcontrol.wait``) before its first memory access, and lets the next kernel
launch as early. In a CUDA graph of back-to-back layer writes that hides most of each
kernel's launch latency; ordering and memory visibility are those of a plain launch.

File order: kernel, launcher, fp32 reference, key and config models. The dispatch spec
(memo key, heuristic, candidates, tuner hooks) lives in :mod:`kdispatch.kernels.kv_write_spec`.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import torch
import triton
import triton.language as tl
from pydantic import Field, field_validator

from kdispatch.kernels._common import (
    TORCH_DTYPES,
    check_runnable,
    check_tensor,
    interpreting,
)
from kdispatch.registry import OpConfig, OpKey, check_pow2

_FLOAT_DTYPES = tuple(TORCH_DTYPES.values())
_SLOT_DTYPES = (torch.int32, torch.int64)
MAX_TOKENS_BUCKET = 65536


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, mask_ptr, active_ptr,
    num_tokens, num_slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcp, stride_kch,
    stride_vcb, stride_vcp, stride_vch,
    stride_slot, stride_mask,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_ACTIVE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One program copies BLOCK_T rows x BLOCK_H heads of K and of V into the cache.

    The (row, head) pairs are flattened into the first tile axis, the head dim is the
    second (contiguous) one. K/V are loaded without waiting for the slot, so the slot and
    data loads overlap; only the stores depend on the slot. With ``USE_PDL`` it waits for
    the previous grid before touching memory and then lets the next grid launch.
    """
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    r = tl.arange(0, BLOCK_T * BLOCK_H)
    t = (pid_t * BLOCK_T + r // BLOCK_H).to(tl.int64)
    h = (pid_h * BLOCK_H + r % BLOCK_H).to(tl.int64)
    d = tl.arange(0, BLOCK_D)

    in_range = t < num_tokens
    if NUM_HEADS % BLOCK_H != 0:
        in_range = in_range & (h < NUM_HEADS)
    if HEAD_DIM == BLOCK_D:
        ld_mask = in_range[:, None]
    else:
        ld_mask = in_range[:, None] & (d[None, :] < HEAD_DIM)

    k = tl.load(k_ptr + (t * stride_kt + h * stride_kh)[:, None] + d[None, :], mask=ld_mask)
    v = tl.load(v_ptr + (t * stride_vt + h * stride_vh)[:, None] + d[None, :], mask=ld_mask)

    slot = tl.load(slot_ptr + t * stride_slot, mask=in_range, other=-1).to(tl.int64)
    # slots outside [0, num_slots) skip the row: a bad slot never writes outside the cache
    write = in_range & (slot >= 0) & (slot < num_slots)
    if HAS_MASK:
        keep = tl.load(mask_ptr + t * stride_mask, mask=in_range, other=0)
        write = write & (keep != 0)
    if HAS_ACTIVE:
        n_active = tl.load(active_ptr)
        write = write & (t < n_active)
    slot = tl.where(write, slot, 0)
    blk = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    if HEAD_DIM == BLOCK_D:
        st_mask = write[:, None]
    else:
        st_mask = write[:, None] & (d[None, :] < HEAD_DIM)

    kc_off = blk * stride_kcb + off * stride_kcp + h * stride_kch
    vc_off = blk * stride_vcb + off * stride_vcp + h * stride_vch
    tl.store(kc_ptr + kc_off[:, None] + d[None, :], k, mask=st_mask)
    tl.store(vc_ptr + vc_off[:, None] + d[None, :], v, mask=st_mask)


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------
def _check_inputs(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any,
                  row_mask: Any, active_rows: Any) -> None:
    check_tensor("key", key, ndim=3, dtypes=_FLOAT_DTYPES, last_contiguous=True)
    check_runnable("key", key)
    dev = key.device
    check_tensor("value", value, ndim=3, dtypes=(key.dtype,), device=dev, last_contiguous=True)
    if value.shape != key.shape:
        raise ValueError(f"value: shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    num_tokens, num_heads, head_dim = key.shape
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if isinstance(cache, torch.Tensor) and cache.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D [num_blocks, page_size, heads, dim] "
                             f"cache, got shape {tuple(cache.shape)}")
        check_tensor(name, cache, ndim=4, dtypes=(key.dtype,), device=dev, last_contiguous=True)
        if tuple(cache.shape[2:]) != (num_heads, head_dim):
            raise ValueError(f"{name}: shape {tuple(cache.shape)} is not [num_blocks, page_size, "
                             f"{num_heads}, {head_dim}] (heads and dim of key)")
        if cache.shape[0] < 1 or cache.shape[1] < 1:
            raise ValueError(f"{name}: empty cache of shape {tuple(cache.shape)}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache: shape {tuple(value_cache.shape)} != key_cache shape "
                         f"{tuple(key_cache.shape)}")
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=_SLOT_DTYPES, device=dev)
    if slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"slot_mapping: shape {tuple(slot_mapping.shape)} != [{num_tokens}] "
                         "(one slot per key row)")
    if row_mask is not None:
        check_tensor("row_mask", row_mask, ndim=1, dtypes=(torch.bool,), device=dev)
        if row_mask.shape[0] != num_tokens:
            raise ValueError(f"row_mask: shape {tuple(row_mask.shape)} != [{num_tokens}]")
    if active_rows is not None:
        check_tensor("active_rows", active_rows, dtypes=(torch.int32,), device=dev)
        if active_rows.numel() != 1:
            raise ValueError(f"active_rows: expected a one-element tensor, got shape "
                             f"{tuple(active_rows.shape)}")


@functools.lru_cache(maxsize=None)
def supports_pdl(device: torch.device) -> bool:
    """True for a CUDA device of compute capability 9.0+ outside the interpreter."""
    if device.type != "cuda" or interpreting() or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _indexed_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """The baseline: one torch indexed assignment for K and one for V (slots must be >= 0)."""
    for src, cache in ((key, key_cache), (value, value_cache)):
        num_blocks, page_size, num_heads, head_dim = cache.shape
        if page_size == 1 or cache.stride(0) == page_size * cache.stride(1):
            cache.view(num_blocks * page_size, num_heads, head_dim)[slot_mapping] = src
        else:  # blocks and offsets are not one mergeable dim: index them separately
            cache[slot_mapping // page_size, slot_mapping % page_size] = src


def launch_kv_write(config: KVWriteConfig, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, row_mask: torch.Tensor | None = None,
                    active_rows: torch.Tensor | None = None) -> None:
    """Write ``key``/``value`` rows into the paged caches in place, with an explicit config.

    Parameters
    ----------
    config : KVWriteConfig
        ``variant="fused"`` (one Triton launch) or ``"indexed"`` (two torch indexed
        assignments; no ``row_mask``/``active_rows``, and every slot must be >= 0).
    key, value : Tensor ``[T, H, D]``
        float32, float16 or bfloat16; any strides with a contiguous last dim.
    key_cache, value_cache : Tensor ``[num_blocks, page_size, H, D]``
        Same dtype and device as ``key``; contiguous last dim, otherwise any strides.
    slot_mapping : int32 or int64 Tensor ``[T]``
        ``block * page_size + offset``; a negative slot skips the row. Written slots must be
        unique (which of two rows writing one slot wins is unspecified).
    row_mask : bool Tensor ``[T]``, optional
        Rows with False are skipped.
    active_rows : int32 Tensor with one element, optional
        Only rows ``t < active_rows[0]`` are written.

    Raises
    ------
    ValueError
        Naming the argument, for a malformed input or a config that cannot serve it.

    Notes
    -----
    The grid and constexprs depend only on shapes and ``config``; slots, masks and the
    active-row count are read on the device, so the call can be captured in a CUDA graph.
    """
    if not isinstance(config, KVWriteConfig):
        raise ValueError(f"config: expected a KVWriteConfig, got {type(config).__name__}")
    _check_inputs(key, value, key_cache, value_cache, slot_mapping, row_mask, active_rows)
    num_tokens, num_heads, head_dim = key.shape
    if config.variant == "indexed":
        if row_mask is not None or active_rows is not None:
            raise ValueError("config: the indexed variant cannot apply row_mask/active_rows "
                             "without a host sync; use variant='fused'")
        if num_tokens:
            _indexed_write(key, value, key_cache, value_cache, slot_mapping)
        return
    if num_tokens == 0:
        return
    # Unused pointers get a harmless stand-in; the constexpr flags keep them unread.
    mask_arg = row_mask.view(torch.uint8) if row_mask is not None else slot_mapping
    active_arg = active_rows if active_rows is not None else slot_mapping
    pdl_kw = {}
    if config.pdl:
        if not supports_pdl(key.device):
            raise ValueError("config: pdl=True needs an NVIDIA GPU of compute capability 9.0 "
                             f"or newer; {key.device} has none")
        pdl_kw["launch_pdl"] = True
    block_d = triton.next_power_of_2(head_dim)
    grid = (triton.cdiv(num_tokens, config.block_t), triton.cdiv(num_heads, config.block_h))
    _kv_write_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping, mask_arg, active_arg,
        num_tokens, key_cache.shape[0] * key_cache.shape[1],
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        slot_mapping.stride(0), mask_arg.stride(0) if row_mask is not None else 0,
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, PAGE_SIZE=key_cache.shape[1],
        BLOCK_T=config.block_t, BLOCK_H=config.block_h, BLOCK_D=block_d,
        HAS_MASK=row_mask is not None, HAS_ACTIVE=active_rows is not None,
        USE_PDL=config.pdl, num_warps=config.num_warps, **pdl_kw,
    )


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
def reference_kv_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                       row_mask: torch.Tensor | None = None,
                       active_rows: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 reference: the pools after the write, computed on fp32 copies.

    Same arguments as :func:`launch_kv_write`; nothing passed in is modified. It reads
    device values (it is a specification, not a graph-safe path).

    Returns
    -------
    (k_pool, v_pool) : float32 Tensors ``[num_blocks, page_size, H, D]``
        Copies of the caches with every written row replaced by ``key``/``value``.
    """
    k_pool = key_cache.detach().to(torch.float32, copy=True)
    v_pool = value_cache.detach().to(torch.float32, copy=True)
    num_tokens = key.shape[0]
    page_size = key_cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    write = (slots >= 0) & (slots < key_cache.shape[0] * page_size)
    if row_mask is not None:
        write &= row_mask.to(torch.bool)
    if active_rows is not None:
        rows = torch.arange(num_tokens, device=slots.device)
        write &= rows < active_rows.reshape(()).to(torch.int64)
    rows = write.nonzero().flatten()
    chosen = slots[rows]
    blocks, offsets = chosen // page_size, chosen % page_size
    k_pool[blocks, offsets] = key.detach()[rows].to(torch.float32)
    v_pool[blocks, offsets] = value.detach()[rows].to(torch.float32)
    return k_pool, v_pool


# ---------------------------------------------------------------------------------------------
# Key and config (what a launch is parameterized by)
# ---------------------------------------------------------------------------------------------
Masking = Literal["none", "row_mask", "active_rows", "both"]
Variant = Literal["indexed", "fused"]

# Limits of a fused program's tile (elements per operand); above them registers spill.
MAX_TILE = 16384
MAX_ELEMS_PER_THREAD = 128
BLOCK_H_MAX = 64
BLOCK_T_MAX = 64


class KVWriteKey(OpKey):
    """Dispatch key of ``kv_write``: device fields plus dtype, heads, dim, page, tokens, masking.

    ``tokens`` is the bucketed row count (:func:`~kdispatch.buckets.pow2_bucket`, 1..65536);
    ``masking`` says which of ``row_mask`` / ``active_rows`` the call passes.
    """

    dtype: Literal["float32", "float16", "bfloat16"]
    num_kv_heads: int = Field(ge=1, le=1024)
    head_dim: int = Field(ge=1, le=1024)
    page_size: int = Field(ge=1, le=4096)
    tokens: int = Field(ge=1, le=MAX_TOKENS_BUCKET)
    masking: Masking = "none"

    @field_validator("tokens")
    @classmethod
    def _tokens_bucket(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"tokens must be a power-of-two bucket, got {v}")
        return v


class KVWriteConfig(OpConfig):
    """Launch config of ``kv_write``.

    Attributes
    ----------
    variant : {"fused", "indexed"}
        ``fused``: one Triton launch for K and V. ``indexed``: two torch indexed
        assignments (the baseline; unmasked keys only, never a tuning candidate).
    block_h : int
        Heads per fused program (power of two, 1..64).
    block_t : int
        Token rows per fused program (power of two, 1..64).
    num_warps : int
        Warps per fused program.
    pdl : bool
        Launch the fused writer as a programmatic dependent launch (NVIDIA sm_90+ only).
    """

    variant: Variant = "fused"
    block_h: int = 1
    block_t: int = 1
    pdl: bool = False

    @field_validator("block_h")
    @classmethod
    def _block_h(cls, v: int) -> int:
        return check_pow2("block_h", v, 1, BLOCK_H_MAX)

    @field_validator("block_t")
    @classmethod
    def _block_t(cls, v: int) -> int:
        return check_pow2("block_t", v, 1, BLOCK_T_MAX)
