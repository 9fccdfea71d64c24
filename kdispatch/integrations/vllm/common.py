"""What the GQA/MHA and MLA backends share: config resolution and selection wording."""

from __future__ import annotations

from typing import Any

import kdispatch
from kdispatch.integrations.vllm.limits import dtype_name

#: vLLM's generic selection reasons that kdispatch's own (which name the value) replace
SELECTION_GENERIC_REASONS = frozenset(
    {"head_size not supported", "dtype not supported", "kv_cache_dtype not supported",
     "block_size not supported"})


def resolve_decode_config(device: Any, *, batch: int, context: int, num_q_heads: int,
                          num_kv_heads: int, head_dim: int, head_dim_v: int, page_size: int,
                          dtype: Any, kv_dtype: Any, sliding_window: int | None = None,
                          batch_invariant: bool = False) -> Any:
    """``kdispatch.resolve`` for one decode step from host-known shapes only.

    ``context`` is the block-table width times the page size (the capacity every request of
    the batch could reach), never a live length, so the config is the same for every step
    of a batch size and a CUDA-graph capture keeps it.
    """
    return kdispatch.resolve(
        "decode_attention", device=device, batch=max(int(batch), 1),
        context=max(int(context), 1), num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, head_dim_v=head_dim_v, page_size=page_size,
        dtype=dtype_name(dtype), kv_dtype=dtype_name(kv_dtype),
        sliding_window=sliding_window, batch_invariant=batch_invariant)
