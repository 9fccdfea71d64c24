"""Host-side input checks of ``kv_write`` (shapes, dtypes, strides and devices only)."""

from __future__ import annotations

from typing import Any

import torch

from kdispatch.kernels._common import (
    FP8_TORCH_DTYPES,
    check_fp8,
    check_runnable,
    check_scales,
    check_tensor,
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SLOT_DTYPES = (torch.int32, torch.int64)


def check_inputs(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any,
                 row_mask: Any, active_rows: Any, k_scale: Any = None,
                 v_scale: Any = None) -> None:
    """Raise ValueError naming the offending argument when the inputs do not fit the op.

    A cache has ``key``'s dtype or an fp8 dtype (both caches the same); scales go with an
    fp8 cache only.
    """
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_runnable("key", key)
    dev = key.device
    check_tensor("value", value, ndim=3, dtypes=(key.dtype,), device=dev, last_contiguous=True)
    if value.shape != key.shape:
        raise ValueError(f"value: shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    num_tokens, num_heads, head_dim = key.shape
    cache_dtypes = (key.dtype, *FP8_TORCH_DTYPES)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if isinstance(cache, torch.Tensor) and cache.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D [num_blocks, page_size, heads, dim] "
                             f"cache, got shape {tuple(cache.shape)}")
        check_tensor(name, cache, ndim=4, dtypes=cache_dtypes, device=dev,
                     last_contiguous=True)
        if name == "value_cache" and cache.dtype != key_cache.dtype:
            raise ValueError(f"value_cache: dtype {str(cache.dtype).removeprefix('torch.')} "
                             f"differs from key_cache's "
                             f"{str(key_cache.dtype).removeprefix('torch.')}")
        if tuple(cache.shape[2:]) != (num_heads, head_dim):
            raise ValueError(f"{name}: shape {tuple(cache.shape)} is not [num_blocks, page_size, "
                             f"{num_heads}, {head_dim}] (heads and dim of key)")
        if cache.shape[0] < 1 or cache.shape[1] < 1:
            raise ValueError(f"{name}: empty cache of shape {tuple(cache.shape)}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache: shape {tuple(value_cache.shape)} != key_cache shape "
                         f"{tuple(key_cache.shape)}")
    check_fp8("key_cache", key_cache)
    check_scales(k_scale, v_scale, key_cache, "key_cache")
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=SLOT_DTYPES, device=dev)
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
