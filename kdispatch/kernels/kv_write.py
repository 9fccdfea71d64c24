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

File order: kernel, launcher, fp32 reference, dispatch spec (key, config, heuristic).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Literal

import torch
import triton
import triton.language as tl
from pydantic import Field, field_validator

from kdispatch.buckets import pow2_bucket
from kdispatch.device import Device
from kdispatch.kernels._common import (
    TORCH_DTYPES,
    check_runnable,
    check_tensor,
    dtype_name,
)
from kdispatch.registry import NUM_WARPS, OpConfig, OpKey, OpSpec, check_pow2

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
    HAS_MASK: tl.constexpr, HAS_ACTIVE: tl.constexpr,
):
    """One program copies BLOCK_T rows x BLOCK_H heads of K and of V into the cache.

    The (row, head) pairs are flattened into the first tile axis, the head dim is the
    second (contiguous) one. K/V are loaded without waiting for the slot, so the slot and
    data loads overlap; only the stores depend on the slot.
    """
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
        num_warps=config.num_warps,
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
# Dispatch spec
# ---------------------------------------------------------------------------------------------
Masking = Literal["none", "row_mask", "active_rows", "both"]
Variant = Literal["indexed", "fused"]

# Limits of a fused program's tile (elements per operand); above them registers spill.
MAX_TILE = 16384
MAX_ELEMS_PER_THREAD = 128
BLOCK_H_MAX = 64
BLOCK_T_MAX = 64

# Tile elements per operand (heads x padded head dim) a fused program copies, by token
# bucket. H200, 16x128 bf16, 96 graph-replayed writes (bench/results/nvidia-h200/
# kv_write.json sweep): T=1 best at 512 (4 heads: 1.110 us/write vs 1.230 at 2048);
# T=64 best at 2048 (16 heads: 2.156 vs 2.210 at 512); T=16384 within 1% for 1024-2048.
_TILE_BY_TOKENS: tuple[tuple[int, int], ...] = ((1, 512), (MAX_TOKENS_BUCKET, 2048))
# Warps by tile elements per operand. Same sweep: 512-element tile best at 4 warps (1.110 vs
# 1.143 us at 2, 1.151 at 1); 2048 best at 4 for T=64 (2.156 vs 2.231 at 2), and 8 vs 4
# within 0.5% for the 16384-token write. Small tiles: no more warps than 16 B vectors.
_WARPS_BY_TILE: tuple[tuple[int, int], ...] = ((128, 1), (256, 2), (2048, 4), (MAX_TILE, 8))
# Rows per program: 1. Same sweep: 2 or 4 rows never beat 1 (T=64: 2.160 vs 2.156 us;
# T=16384: 70.24 vs 69.46 us at 8 heads, 8 warps).
_BLOCK_T = 1


def _ladder(table: tuple[tuple[int, int], ...], x: int) -> int:
    """The value of the first (limit, value) rung with ``x <= limit`` (else the last)."""
    for limit, value in table:
        if x <= limit:
            return value
    return table[-1][1]


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
    """

    variant: Variant = "fused"
    block_h: int = 1
    block_t: int = 1

    @field_validator("block_h")
    @classmethod
    def _block_h(cls, v: int) -> int:
        return check_pow2("block_h", v, 1, BLOCK_H_MAX)

    @field_validator("block_t")
    @classmethod
    def _block_t(cls, v: int) -> int:
        return check_pow2("block_t", v, 1, BLOCK_T_MAX)


def _tensor_arg(args: Mapping[str, Any], name: str) -> torch.Tensor:
    t = args.get(name)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def _masking(has_mask: bool, has_active: bool) -> Masking:
    if has_mask and has_active:
        return "both"
    return "row_mask" if has_mask else ("active_rows" if has_active else "none")


def _is_tensor_form(args: Mapping[str, Any]) -> bool:
    return args.get("key") is not None


class KVWriteSpec(OpSpec):
    """The ``kv_write`` op: see the module docstring."""

    name = "kv_write"
    key_model = KVWriteKey
    config_model = KVWriteConfig
    source_modules = ("kdispatch.kernels.kv_write",)

    _PLAIN = ("tokens", "num_kv_heads", "head_dim", "page_size", "dtype")

    # -- resolution ----------------------------------------------------------------------------
    def memo_key(self, args: Mapping[str, Any]) -> Hashable:
        if _is_tensor_form(args):
            key = _tensor_arg(args, "key")
            cache = _tensor_arg(args, "key_cache")
            return ("t", tuple(key.shape), key.dtype, key.device,
                    cache.shape[1] if cache.dim() == 4 else None,
                    args.get("row_mask") is not None, args.get("active_rows") is not None)
        return ("p", args.get("device"), *(args.get(n) for n in self._PLAIN),
                args.get("masking", "none"))

    def key(self, device: Device, args: Mapping[str, Any]) -> KVWriteKey:
        fields = OpKey.device_fields(device)
        if _is_tensor_form(args):
            key = _tensor_arg(args, "key")
            cache = _tensor_arg(args, "key_cache")
            if key.dim() != 3:
                raise ValueError(f"key: expected [T, H, D], got shape {tuple(key.shape)}")
            if cache.dim() != 4:
                raise ValueError(f"key_cache: expected a 4-D [num_blocks, page_size, heads, "
                                 f"dim] cache, got shape {tuple(cache.shape)}")
            num_tokens, num_heads, head_dim = key.shape
            return KVWriteKey(
                **fields, dtype=dtype_name(key.dtype, "key"), num_kv_heads=num_heads,
                head_dim=head_dim, page_size=cache.shape[1],
                tokens=pow2_bucket(max(int(num_tokens), 1), 1, MAX_TOKENS_BUCKET),
                masking=_masking(args.get("row_mask") is not None,
                                 args.get("active_rows") is not None))
        missing = [n for n in self._PLAIN if args.get(n) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required for a plain-form kv_write key "
                             f"(or pass the key/key_cache tensors)")
        tokens = int(args["tokens"])
        if tokens < 1:
            raise ValueError(f"tokens: must be >= 1, got {tokens}")
        return KVWriteKey(
            **fields, dtype=dtype_name(args["dtype"]), num_kv_heads=args["num_kv_heads"],
            head_dim=args["head_dim"], page_size=args["page_size"],
            tokens=pow2_bucket(tokens, 1, MAX_TOKENS_BUCKET),
            masking=args.get("masking", "none"))

    def device_of(self, args: Mapping[str, Any]) -> Device | str | None:
        if _is_tensor_form(args):
            return _tensor_arg(args, "key").device
        return args.get("device")

    def heuristic(self, key: KVWriteKey) -> KVWriteConfig:  # type: ignore[override]
        block_d = triton.next_power_of_2(key.head_dim)
        per_row = max(1, min(BLOCK_H_MAX, _ladder(_TILE_BY_TOKENS, key.tokens) // block_d))
        block_h = min(per_row, triton.next_power_of_2(key.num_kv_heads))
        block_t = _BLOCK_T
        tile = block_t * block_h * block_d
        return KVWriteConfig(variant="fused", block_h=block_h, block_t=block_t,
                             num_warps=_ladder(_WARPS_BY_TILE, tile))

    def candidates(self, key: KVWriteKey) -> Iterable[KVWriteConfig]:  # type: ignore[override]
        out = []
        for block_h in (1, 2, 4, 8, 16, 32, 64):
            for block_t in (1, 2, 4, 8):
                for num_warps in NUM_WARPS:
                    cfg = KVWriteConfig(variant="fused", block_h=block_h, block_t=block_t,
                                        num_warps=num_warps)
                    if self.is_valid(key, cfg):
                        out.append(cfg)
        return out

    def is_valid(self, key: KVWriteKey, config: KVWriteConfig) -> bool:  # type: ignore[override]
        if config.variant == "indexed":
            # Skipping rows by mask or active count would need a host sync: never allowed.
            return key.masking == "none"
        if config.block_h > triton.next_power_of_2(key.num_kv_heads):
            return False
        if config.block_t > key.tokens:
            return False
        tile = config.block_t * config.block_h * triton.next_power_of_2(key.head_dim)
        if tile > MAX_TILE or tile > MAX_ELEMS_PER_THREAD * 32 * config.num_warps:
            return False
        # more warps than the tile has 16-byte vectors only adds idle threads
        return config.num_warps == 1 or tile >= 32 * config.num_warps * 4

    def baseline(self, key: KVWriteKey) -> KVWriteConfig:  # type: ignore[override]
        return KVWriteConfig(variant="indexed")

    # -- launching -------------------------------------------------------------------------
    def launch(self, config: OpConfig, **call_args: Any) -> None:
        return launch_kv_write(config, **call_args)  # type: ignore[arg-type]

    # -- tuning hooks ----------------------------------------------------------------------
    def make_inputs(self, key: KVWriteKey, device: Any, seed: int  # type: ignore[override]
                    ) -> dict[str, Any]:
        """Random inputs at ``key``: K/V as strided views of one qkv projection, random
        (never zero) pre-filled caches, unique random slots including the first and last
        slot of the cache; with masking, some negative slots, a random row mask and an
        active-row count below ``tokens``."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        dtype = TORCH_DTYPES[key.dtype]
        num_tokens, num_heads, head_dim = key.tokens, key.num_kv_heads, key.head_dim
        hd = num_heads * head_dim
        page = key.page_size
        num_blocks = max(2, triton.cdiv(2 * num_tokens, page) + 1)
        num_slots = num_blocks * page

        def rand(*shape: int) -> torch.Tensor:
            x = torch.rand(*shape, generator=gen) * 2 - 1
            return (x + torch.where(x >= 0, 0.25, -0.25)).to(dtype).to(device)

        qkv = rand(num_tokens, 3 * hd)
        key_t = qkv[:, hd:2 * hd].view(num_tokens, num_heads, head_dim)
        value_t = qkv[:, 2 * hd:].view(num_tokens, num_heads, head_dim)
        key_cache = rand(num_blocks, page, num_heads, head_dim)
        value_cache = rand(num_blocks, page, num_heads, head_dim)
        # unique interior slots, then the first and the last slot of the cache
        slots = torch.randperm(num_slots - 2, generator=gen)[:num_tokens] + 1
        slots[0] = 0
        if num_tokens > 1:
            slots[-1] = num_slots - 1
        row_mask = active_rows = None
        if key.masking != "none":
            skip = torch.rand(num_tokens, generator=gen) < 0.125
            slots[skip] = -1
        if key.masking in ("row_mask", "both"):
            row_mask = (torch.rand(num_tokens, generator=gen) < 0.75).to(device)
        if key.masking in ("active_rows", "both"):
            n = int(torch.randint(num_tokens // 2, num_tokens + 1, (1,), generator=gen))
            active_rows = torch.tensor([n], dtype=torch.int32, device=device)
        return {"key": key_t, "value": value_t, "key_cache": key_cache,
                "value_cache": value_cache, "slot_mapping": slots.to(device),
                "row_mask": row_mask, "active_rows": active_rows,
                # pristine pools: the reference must not see a candidate's writes
                "initial_key_cache": key_cache.clone(),
                "initial_value_cache": value_cache.clone()}

    @staticmethod
    def _call_args(inputs: Mapping[str, Any]) -> dict[str, Any]:
        names = ("key", "value", "key_cache", "value_cache", "slot_mapping", "row_mask",
                 "active_rows")
        return {n: inputs.get(n) for n in names}

    def run(self, config: OpConfig, inputs: dict[str, Any]
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write in place into ``inputs``' caches; returns the pools ``(k_cache, v_cache)``."""
        args = self._call_args(inputs)
        launch_kv_write(config, **args)  # type: ignore[arg-type]
        return args["key_cache"], args["value_cache"]

    def reference(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 pools after the write, computed from the pristine caches of ``make_inputs``."""
        args = self._call_args(inputs)
        args["key_cache"] = inputs.get("initial_key_cache", args["key_cache"])
        args["value_cache"] = inputs.get("initial_value_cache", args["value_cache"])
        return reference_kv_write(**args)

    def tolerance(self, key: OpKey) -> tuple[float, float]:
        return (0.0, 0.0)  # a copy: bit-exact in every dtype

    def bytes_moved(self, key: KVWriteKey) -> int:  # type: ignore[override]
        """K and V rows read once and written once, plus the int64 slots and the masks."""
        elt = TORCH_DTYPES[key.dtype].itemsize
        rows = key.tokens * key.num_kv_heads * key.head_dim * elt
        extra = key.tokens * 8
        if key.masking in ("row_mask", "both"):
            extra += key.tokens
        if key.masking in ("active_rows", "both"):
            extra += 4
        return 4 * rows + extra


SPEC = KVWriteSpec()
