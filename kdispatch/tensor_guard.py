"""One C++ check that tensors have the type, device, dtype and shape of earlier ones (the
decode memo hit's fast path, :meth:`DecodeOp.memo_guard`).

torch's ``TensorGuards`` (the tensor check behind ``torch.compile``'s guards) compares each
tensor's Python type, dispatch keys (which name the device type), device index, dtype,
``requires_grad`` and the sizes it is given, in C++: ~0.3 us for the decode call's four
tensors, where reading the memo key's six attributes in Python (each ``.shape`` a new
``torch.Size``, each ``.device`` a new ``torch.device``) and comparing costs ~0.55 us.
It is private to torch, so it is used only if it imports and passes :func:`_works` (its
accepts and refusals checked once, on CPU and meta tensors); otherwise
:func:`shape_guard` returns None and callers keep their memo key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:  # noqa: BLE001 - a torch without it: no fast path
    _TensorGuards = None


def _build(tensors: tuple[Any, ...], strides: bool = False) -> Callable[..., bool] | None:
    try:
        return _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                             dynamic_dims_strides=[list(t.stride()) if strides
                                                   else [None] * t.dim() for t in tensors]
                             ).check
    except Exception:  # noqa: BLE001 - not tensors, or an API change: no fast path
        return None


def _works() -> bool:
    """Whether the check accepts the same signature and refuses another dtype, device
    type (meta and cpu: both device index -1), shape, rank or tensor type, and (built
    with strides) another stride."""
    a, b = torch.zeros(2, 3), torch.zeros(4, dtype=torch.int32)
    check, layout = _build((a, b)), _build((a, b), strides=True)
    if check is None or layout is None:
        return False
    others = [(a.double(), b), (torch.zeros(2, 3, device="meta"), b), (a, b[:3]),
              (a.view(3, 2), b), (a.view(2, 3, 1), b), (a, b.long()), (a, [0, 0, 0, 0]),
              (a.as_subclass(torch.nn.Parameter), b)]
    try:
        same = check(torch.ones(2, 3), torch.ones(4, dtype=torch.int32)) is True
        strided = torch.zeros(3, 2).t()  # a's shape, other strides
        return (same and not any(check(*o) for o in others) and check(strided, b) is True
                and layout(torch.ones(2, 3), b) is True and layout(strided, b) is False
                and layout(a, torch.zeros(8, dtype=torch.int32)[::2]) is False)
    except Exception:  # noqa: BLE001 - a check that raises: no fast path (never an import error)
        return False


if _TensorGuards is not None and not _works():
    _TensorGuards = None


def shape_guard(*tensors: Any) -> Callable[..., bool] | None:
    """``check(*others) -> bool``, True only where each of ``others`` has the Python type,
    dispatch keys (device type), device index, dtype, ``requires_grad`` and shape of the
    tensor given here at its place (strides are not compared, nor contents). It holds no
    reference to the tensors. None where torch has no such check, ``tensors`` are not all
    tensors, or one is given twice (torch's check refuses a tensor seen twice in a call)."""
    return _guard(tensors, strides=False)


def layout_guard(*tensors: Any) -> Callable[..., bool] | None:
    """:func:`shape_guard` that also compares strides: True only where each tensor has the
    Python type, device type and index, dtype, ``requires_grad``, shape and strides of the
    one given here (not the storage offset or the data pointer: callers compare pointer
    alignment themselves). None where :func:`shape_guard` would be."""
    return _guard(tensors, strides=True)


def _guard(tensors: tuple[Any, ...], strides: bool) -> Callable[..., bool] | None:
    if _TensorGuards is None or len({id(t) for t in tensors}) < len(tensors):
        return None
    return _build(tensors, strides)
