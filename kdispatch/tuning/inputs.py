"""The inputs a candidate is verified and timed on: a warning for all-zero inputs, and the
extra input sets that keep a working set smaller than the L2 cache from being timed hot."""

from __future__ import annotations

import logging
import math
from typing import Any

from kdispatch.opdef import Op

log = logging.getLogger(__name__)

#: extra input sets for L2 rotation are capped at this many bytes in total
ROTATION_BYTES = 2 << 30
MAX_INPUT_SETS = 8


def _storage_bytes(inputs: dict[str, Any]) -> int:
    import torch

    seen, total = set(), 0
    for v in inputs.values():
        if isinstance(v, torch.Tensor):
            st = v.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
    return total


def warn_zero_inputs(op: str, inputs: dict[str, Any]) -> None:
    import torch

    for name, v in inputs.items():
        if not (isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()):
            continue
        # one-byte floats (fp8) have no reductions on CUDA: test their bits (0x00 and 0x80
        # are the zeros)
        nonzero = ((v.view(torch.uint8) & 0x7F).any() if v.element_size() == 1
                   else v.any())
        if not bool(nonzero):
            log.warning("%s: make_inputs gave an all-zero %r; timing on zeros flatters "
                        "kernels (random inputs expected)", op, name)


def rotation_sets(spec: Op, key: Any, tdev: Any, seed: int,
                   first: dict[str, Any]) -> list[dict[str, Any]]:
    """Input sets to cycle through while timing, so small working sets are not timed hot."""
    import torch

    if tdev.type != "cuda":
        return [first]
    l2 = int(getattr(torch.cuda.get_device_properties(tdev), "L2_cache_size", 0) or 0)
    moved = max(int(spec.tuning.bytes_moved(key)), 1)
    if not l2 or moved >= 4 * l2:
        return [first]
    per_set = max(_storage_bytes(first), 1)
    n = min(MAX_INPUT_SETS, math.ceil(4 * l2 / moved), max(1, ROTATION_BYTES // per_set))
    return [first] + [spec.tuning.make_inputs(key, tdev, seed + 1000 + i)
                      for i in range(n - 1)]
