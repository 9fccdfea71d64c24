"""Host-side input checks of ``decode_attention`` (shapes, dtypes, strides, devices only).

Nothing here reads device memory: a page id outside the cache or a length past the page
table is handled in the kernel (masked, clamped), never checked on the host.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from kdispatch.kernels._common import check_runnable, check_tensor

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def shares_latent(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """True when ``v_cache`` addresses the first Dv columns of ``k_cache`` (absorbed MLA).

    Decided from host metadata only (data pointer, shapes, strides), so it is
    capture-safe: then the kernel reuses each loaded K tile as the V tile. Any other
    ``v_cache`` (a separate tensor, or a view at another offset) is read on its own.
    """
    return (v_cache.data_ptr() == k_cache.data_ptr() and v_cache.dtype == k_cache.dtype
            and v_cache.shape[:3] == k_cache.shape[:3]
            and v_cache.stride()[:3] == k_cache.stride()[:3]
            and v_cache.shape[3] <= k_cache.shape[3])


def check_decode_inputs(q: Any, k_cache: Any, v_cache: Any, block_table: Any,
                        seq_lens: Any) -> None:
    """Raise ValueError naming the offending argument when the tensors do not fit the op."""
    check_tensor("q", q, ndim=3, dtypes=DTYPES, last_contiguous=True)
    check_runnable("q", q)
    dev = q.device
    check_tensor("k_cache", k_cache, ndim=4, dtypes=DTYPES, device=dev, last_contiguous=True)
    if k_cache.dtype != q.dtype:
        raise ValueError(f"k_cache: dtype {str(k_cache.dtype).removeprefix('torch.')} differs "
                         f"from q's {str(q.dtype).removeprefix('torch.')}; pass q in the "
                         "cache's dtype")
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=dev,
                 last_contiguous=True)
    check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=dev)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    b, hq, dk = q.shape
    nb, page, hk, dk_c = k_cache.shape
    if tuple(v_cache.shape[:3]) != (nb, page, hk):
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} must match k_cache's "
                         f"{tuple(k_cache.shape[:3])} in its first three dims")
    if dk_c != dk:
        raise ValueError(f"k_cache: head dim {dk_c} != q's head dim {dk}")
    dv = v_cache.shape[3]
    if dv > dk or dv < 1:
        raise ValueError(f"v_cache: head dim {dv} must be in [1, {dk}] (q/k head dim)")
    if dk - dv > 256:
        raise ValueError(f"v_cache: head dim {dv} leaves {dk - dv} extra q/k columns; "
                         "at most 256 are supported")
    if dv > 512:
        raise ValueError(f"v_cache: head dim {dv} > 512 is not supported")
    if hk < 1 or hq % hk:
        raise ValueError(f"q: {hq} heads is not a multiple of k_cache's {hk} kv heads")
    if block_table.shape[0] != b:
        raise ValueError(f"block_table: {block_table.shape[0]} rows for a batch of {b}")
    if block_table.shape[1] < 1:
        raise ValueError("block_table: needs at least one page column")
    if seq_lens.shape[0] != b:
        raise ValueError(f"seq_lens: {seq_lens.shape[0]} entries for a batch of {b}")
    if b < 1 or hq < 1:
        raise ValueError(f"q: empty batch or head dim in shape {tuple(q.shape)}")
    if nb < 1:
        raise ValueError(f"k_cache: no pages in shape {tuple(k_cache.shape)}")
    if page < 1 or page & (page - 1):
        raise ValueError(f"k_cache: page size {page} must be a power of two")


def check_call(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any,
               scale: Any, out: Any, sliding_window: Any, logit_cap: Any) -> None:
    """Every host check of one call: the tensors, the output and the scalar arguments."""
    check_decode_inputs(q, k_cache, v_cache, block_table, seq_lens)
    if isinstance(scale, bool) or not isinstance(scale, float | int) \
            or not math.isfinite(scale):
        raise ValueError(f"scale: must be a finite float, got {scale!r}")
    if sliding_window is not None and (isinstance(sliding_window, bool)
                                       or not isinstance(sliding_window, numbers.Integral)
                                       or sliding_window < 1):
        raise ValueError(f"sliding_window: must be None or an int >= 1, got {sliding_window!r}")
    if isinstance(logit_cap, bool) or not isinstance(logit_cap, float | int) \
            or not logit_cap >= 0.0 or not math.isfinite(logit_cap):
        raise ValueError(f"logit_cap: must be a finite float >= 0, got {logit_cap!r}")
    if out is not None:
        check_tensor("out", out, ndim=3, dtypes=(q.dtype,), device=q.device,
                     last_contiguous=True)
        b, hq, _ = q.shape
        if tuple(out.shape) != (b, hq, v_cache.shape[3]):
            raise ValueError(f"out: shape {tuple(out.shape)} != {(b, hq, v_cache.shape[3])}")
