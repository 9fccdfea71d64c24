"""Paged KV-cache writer (op ``kv_write``): scatter new K/V rows into a paged cache.

Layout: ``key``/``value`` are ``[T, H, D]`` with any strides and a contiguous last dim
(typically views into one qkv projection); the caches are ``[num_blocks, page_size, H, D]``
(the vLLM flash layout; K and V caches may have different strides). Row ``t`` goes to slot
``slot_mapping[t] = block * page_size + offset``. A negative slot (or one past the end of
the cache) skips the row, so do rows with ``row_mask[t] == False`` and rows
``t >= active_rows[0]``. Every one of those values is read on the device, so a captured CUDA
graph honours new values on each replay; the grid and every constexpr come from shapes and
the config only.

Variants (the config's ``variant``):

- ``fused``: one Triton launch writing K and V; ``row_mask`` / ``active_rows`` select the
  masked and active-row forms through constexpr flags. Addresses are 64-bit, so a cache
  may exceed 2^31 elements. With ``pdl`` (NVIDIA sm_90+) it is a programmatic dependent
  launch: it waits for the previous kernel (``griddepcontrol.wait``) before its first
  memory access and lets the next one launch early, hiding most of each launch's latency
  in a graph of back-to-back layer writes.
- ``indexed``: two torch indexed assignments, the baseline the benchmarks compare with.

Into an fp8 cache (``float8_e4m3fn``, or ``float8_e4m3fnuz`` on AMD GPUs that use it) the
writer quantizes: ``x / scale`` in fp32 with the per-tensor ``k_scale``/``v_scale``
tensors it reads on the device, saturated to the format's range, rounded to nearest even
(bit for bit ``kdispatch.kernels._common.quantize_fp8``).

Modules: ``kernel`` (the Triton kernel), ``launch`` (plan, launcher, cached path),
``checks``, ``spec`` (key, config, heuristic, validity), ``tuning``, ``reference``,
``torch_op``, ``api`` (the public function), ``op`` (the op declared here as ``OP``).
"""

from kdispatch.kernels.kv_write.api import write_kv
from kdispatch.kernels.kv_write.launch import launch_kv_write
from kdispatch.kernels.kv_write.op import OP
from kdispatch.kernels.kv_write.reference import reference_kv_write
from kdispatch.kernels.kv_write.spec import KVWriteConfig, KVWriteKey

__all__ = ["OP", "KVWriteConfig", "KVWriteKey", "launch_kv_write", "reference_kv_write",
           "write_kv"]
