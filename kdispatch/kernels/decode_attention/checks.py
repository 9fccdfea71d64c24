"""Host-side input checks of ``decode_attention`` (shapes, dtypes, strides, devices only).

Nothing here reads device memory: a page id outside the cache or a length past the page
table is handled in the kernel (masked, clamped), never checked on the host.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from kdispatch.kernels._common import (
    FP8_TORCH_DTYPES,
    check_fp8,
    check_runnable,
    check_scales,
    check_tensor,
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: new tokens per request (speculative decoding / multi-token prediction) a call may carry
MAX_Q_LEN = 8


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


def q_dims(q: torch.Tensor) -> tuple[int, int, int, int]:
    """``(batch, q_len, heads, head dim)`` of a ``[B, Hq, Dk]`` or ``[B, Q, Hq, Dk]`` q."""
    if q.dim() == 3:
        return q.shape[0], 1, q.shape[1], q.shape[2]
    return tuple(q.shape)  # type: ignore[return-value]


def check_decode_inputs(q: Any, k_cache: Any, v_cache: Any, block_table: Any,
                        seq_lens: Any) -> None:
    """Raise ValueError naming the offending argument when the tensors do not fit the op."""
    check_tensor("q", q, dtypes=DTYPES, last_contiguous=True)
    if q.dim() not in (3, 4):
        raise ValueError(f"q: expected [B, Hq, Dk] or [B, Q, Hq, Dk], got shape "
                         f"{tuple(q.shape)}")
    check_runnable("q", q)
    dev = q.device
    check_tensor("k_cache", k_cache, ndim=4, dtypes=DTYPES + FP8_TORCH_DTYPES, device=dev,
                 last_contiguous=True)
    if k_cache.dtype != q.dtype and k_cache.dtype not in FP8_TORCH_DTYPES:
        raise ValueError(f"k_cache: dtype {str(k_cache.dtype).removeprefix('torch.')} differs "
                         f"from q's {str(q.dtype).removeprefix('torch.')}; pass q in the "
                         "cache's dtype (or use an fp8 cache)")
    check_fp8("k_cache", k_cache)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=dev,
                 last_contiguous=True)
    check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=dev)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    b, q_len, hq, dk = q_dims(q)
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q: {q_len} new tokens per request (dim 1 of shape "
                         f"{tuple(q.shape)}); 1 to {MAX_Q_LEN} are supported")
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
               scale: Any, out: Any, sliding_window: Any, logit_cap: Any, k_scale: Any = None,
               v_scale: Any = None) -> None:
    """Every host check of one call: the tensors, the scales, the output and the scalar
    arguments."""
    check_decode_inputs(q, k_cache, v_cache, block_table, seq_lens)
    check_scales(k_scale, v_scale, k_cache)
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
        check_tensor("out", out, ndim=q.dim(), dtypes=(q.dtype,), device=q.device,
                     last_contiguous=True)
        want = (*q.shape[:-1], v_cache.shape[3])
        if tuple(out.shape) != want:
            raise ValueError(f"out: shape {tuple(out.shape)} != {want}")
