"""The public ``kdispatch.write_kv``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kdispatch.kernels.kv_write import launch
from kdispatch.kernels.kv_write import torch_op as _torch_op  # noqa: F401 - registers the op
from kdispatch.torch_library import config_json

if TYPE_CHECKING:
    from kdispatch.kernels.kv_write.spec import KVWriteConfig

_compiling = torch.compiler.is_compiling


def write_kv(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
             row_mask: torch.Tensor | None = None, active_rows: torch.Tensor | None = None,
             config: KVWriteConfig | dict[str, Any] | None = None,
             k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """Scatter new K/V rows into a paged cache (the ``kv_write`` op), in place.

    Parameters
    ----------
    key, value : Tensor ``[T, H, D]``
        float32, float16 or bfloat16; any strides with a contiguous last dim (e.g. views
        into one qkv projection).
    key_cache, value_cache : Tensor ``[num_blocks, page_size, H, D]``
        ``key``'s device; ``key``'s dtype, or both ``torch.float8_e4m3fn``
        (``float8_e4m3fnuz`` on AMD GPUs that use it): then each value is stored as
        ``x / scale`` in fp32, saturated to the format's range (+-448 for e4m3fn) and
        rounded to nearest even, bit for bit what ``(x.float() / scale).clamp(-448,
        448).to(torch.float8_e4m3fn)`` gives. K and V caches may have different strides.
    slot_mapping : int32/int64 Tensor ``[T]``
        ``block * page_size + offset``; a negative slot, or one past the cache, skips the
        row (never written, never read).
    row_mask : bool Tensor ``[T]``, optional
        Rows with False are not written (read on device at run/replay time).
    active_rows : int32 Tensor ``[1]``, optional
        Only rows ``< active_rows[0]`` write (read on device at run/replay time).
    config : KVWriteConfig or mapping, optional
        Skip resolution and launch this config (it must be valid for the call's key).
    k_scale, v_scale : float32 Tensor ``[1]`` or ``[]``, optional
        Per-tensor scales of an fp8 cache (both or neither; 1.0 when not given), on the
        caches' device and read by the kernel, so a captured graph replays with new
        scales. Given with a non-fp8 cache they are an error.

    Notes
    -----
    The config is resolved from shapes, dtypes and the device only, so the call can be
    captured in a CUDA graph. Under ``torch.compile`` the call becomes the opaque
    ``torch.ops.kdispatch.write_kv``, which declares that it mutates both caches.

    Raises
    ------
    ValueError
        Naming the argument, for a malformed input or an invalid config.
    """
    if _compiling():
        if (row_mask is None and active_rows is None and config is None and k_scale is None
                and v_scale is None):  # the five-argument default overload
            torch.ops.kdispatch.write_kv.default(key, value, key_cache, value_cache,
                                                 slot_mapping)
        else:
            torch.ops.kdispatch.write_kv.full(key, value, key_cache, value_cache,
                                              slot_mapping, row_mask, active_rows,
                                              config_json(config), k_scale, v_scale)
        return
    launch.write_kv(key, value, key_cache, value_cache, slot_mapping, row_mask, active_rows,
                    config, k_scale, v_scale)
