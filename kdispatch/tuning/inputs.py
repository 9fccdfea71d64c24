"""The inputs a key's candidates are verified and timed on (:class:`KeyInputs`): made once
per key, with the reference, a warning for all-zero inputs, and the extra input sets that keep
a working set smaller than the L2 cache from being timed hot."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from kdispatch.opdef import Op

log = logging.getLogger(__name__)

#: extra input sets for L2 rotation are capped at this many bytes in total
ROTATION_BYTES = 2 << 30
MAX_INPUT_SETS = 8


def storage_bytes(inputs: dict[str, Any]) -> int:
    """Bytes of the tensor storages ``inputs`` hold (a storage shared by views once)."""
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


def rotation_count(spec: Op, key: Any, tdev: Any, first: dict[str, Any]) -> int:
    """How many input sets to cycle through while timing (1: the working set is not small
    next to the L2 cache, or this is the CPU)."""
    import torch

    if tdev.type != "cuda":
        return 1
    l2 = int(getattr(torch.cuda.get_device_properties(tdev), "L2_cache_size", 0) or 0)
    moved = max(int(spec.tuning.bytes_moved(key)), 1)
    if not l2 or moved >= 4 * l2:
        return 1
    per_set = max(storage_bytes(first), 1)
    return min(MAX_INPUT_SETS, math.ceil(4 * l2 / moved), max(1, ROTATION_BYTES // per_set))


def copy_inputs(inputs: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[Any, Any]]]:
    """A copy of ``inputs`` at new addresses: each tensor storage copied once (views of one
    storage stay views of its copy, at the same offsets and strides); other values shared.

    Returns the copy and its ``(copy_storage, original_storage)`` pairs, so the copy can be
    reset to the original with one device copy per storage.
    """
    import torch

    new: dict[int, Any] = {}
    pairs: list[tuple[Any, Any]] = []
    out: dict[str, Any] = {}
    for name, v in inputs.items():
        if not isinstance(v, torch.Tensor):
            out[name] = v
            continue
        st = v.untyped_storage()
        if st.nbytes() == 0:
            out[name] = v.clone()
            continue
        dup = new.get(st.data_ptr())
        if dup is None:
            dup = new[st.data_ptr()] = st.clone()
            pairs.append((dup, st))
        out[name] = torch.empty((0,), dtype=v.dtype, device=v.device).set_(
            dup, v.storage_offset(), v.size(), v.stride())
    return out, pairs


class KeyInputs:
    """One key's inputs and reference, made once and shared by all its candidates.

    ``make_inputs(key, device, seed)`` runs once (or its result comes in as ``made``, e.g.
    from describing the key's launches for the compile pool). Those pristine inputs are
    never given to a candidate: every candidate is verified on a working copy that is
    reset from them (one device copy per storage, no allocation, no sync) just before it
    runs, since a candidate may write into its inputs (a KV write does) and a wrong one may
    write anywhere. The reference is computed once, on the working copy before any
    candidate ran. The extra input sets that rotate a small working set out of the L2
    while timing are copies of the pristine inputs at other addresses (the cache holds
    addresses, not values); only verified candidates run on them.

    When the working copy does not fit in device memory, each candidate gets fresh inputs
    from ``make_inputs`` instead (with no extra sets), as the tuner did before.
    """

    def __init__(self, spec: Op, key: Any, tdev: Any, seed: int,
                 made: dict[str, Any] | None = None):
        import torch

        self._make: Callable[[], dict[str, Any]] = lambda: spec.tuning.make_inputs(
            key, tdev, seed)
        pristine = made if made is not None else self._make()
        warn_zero_inputs(spec.name, pristine)
        self._pristine: dict[str, Any] | None = pristine
        self._pairs: list[tuple[Any, Any]] = []
        self.rotation: list[dict[str, Any]] = []
        self._working: dict[str, Any] | None = None
        try:
            self._working, self._pairs = copy_inputs(pristine)
            self.reference = spec.tuning.reference(self._working)
        except torch.cuda.OutOfMemoryError:
            log.info("%s: inputs do not fit twice; making them again for each candidate",
                     spec.name)
            self._working, self._pairs = None, []
            torch.cuda.empty_cache()
            self.reference = spec.tuning.reference(pristine)
        self._fresh: dict[str, Any] | None = None
        if self._working is None:
            self._pristine = None  # the reference is all it was kept for
            return
        try:
            for _ in range(rotation_count(spec, key, tdev, pristine) - 1):
                self.rotation.append(copy_inputs(pristine)[0])
        except torch.cuda.OutOfMemoryError:
            log.info("%s: %d extra input sets fit for timing", spec.name, len(self.rotation))
            torch.cuda.empty_cache()

    @property
    def shared(self) -> bool:
        """True when the candidates share one working copy (False: fresh inputs each)."""
        return self._working is not None

    def for_candidate(self) -> dict[str, Any]:
        """Inputs equal to those the reference saw, for the next candidate to verify on."""
        if self._working is None:
            self._fresh = None  # free the last candidate's before making the next
            self._fresh = self._make()
            return self._fresh
        for dst, src in self._pairs:  # the reference or the last candidate ran on it
            dst.copy_(src)
        return dict(self._working)

    def close(self) -> None:
        """Free the inputs (before the next key's are made)."""
        self._pristine = self._working = self._fresh = None
        self._pairs, self.rotation = [], []
