"""The fp32 torch reference of ``kv_write``: the op's correctness specification."""

from __future__ import annotations

import torch

from kdispatch.kernels._common import FP8_TORCH_DTYPES, quantize_fp8


def reference_kv_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                       row_mask: torch.Tensor | None = None,
                       active_rows: torch.Tensor | None = None,
                       k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The pools after the write, computed on fp32 copies.

    Same arguments as :func:`~kdispatch.kernels.kv_write.launch.launch_kv_write`; nothing
    passed in is modified. It reads device values (a specification, not a graph-safe path).
    Into an fp8 cache the rows are quantized first
    (:func:`~kdispatch.kernels._common.quantize_fp8`), so the pools hold the
    stored fp8 values (not dequantized: the comparison is bit for bit).

    Returns
    -------
    (k_pool, v_pool) : float32 Tensors shaped like the caches
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
    k_rows, v_rows = key.detach()[rows], value.detach()[rows]
    if key_cache.dtype in FP8_TORCH_DTYPES:
        k_rows = quantize_fp8(k_rows, k_scale, key_cache.dtype)
        v_rows = quantize_fp8(v_rows, v_scale, value_cache.dtype)
    k_pool[blocks, offsets] = k_rows.to(torch.float32)
    v_pool[blocks, offsets] = v_rows.to(torch.float32)
    return k_pool, v_pool
