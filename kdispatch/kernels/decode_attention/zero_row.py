"""The row of zeros the Triton stage-1 tiles point unreadable page ids at."""

from __future__ import annotations

from typing import Any

import torch

_ZERO_ROWS: dict[tuple[Any, Any], torch.Tensor] = {}


def zero_row(k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """A row of zeros as wide as the widest cache row, in the caches' dtype on their device,
    never written: where the generic stage 1, and the latent stage 1 at its 64-row tiles,
    point the rows of a page id outside the cache (narrower latent tiles mask those loads).

    Kept per (device, dtype) and reused. Under CUDA-graph capture a new one is made for the
    graph (its zero fill is captured with it) and not kept: its memory is the graph's.
    """
    n = max(k_cache.shape[3], v_cache.shape[3])
    z = _ZERO_ROWS.get((k_cache.device, k_cache.dtype))
    if z is not None and z.numel() >= n:
        return z
    z = torch.zeros(max(n, 1024), dtype=k_cache.dtype, device=k_cache.device)
    if not (k_cache.is_cuda and torch.cuda.is_current_stream_capturing()):
        _ZERO_ROWS[(k_cache.device, k_cache.dtype)] = z
    return z
