"""The Python face of the native launch cache: installing it on a torch op, handing it the
launches the op's Python path has checked, and folding its hit counts into ``stats()``.

An op that uses it (the paged-cache writer's torch op does) defines its torch op
without a CUDA kernel, defines a slow twin of the same schema whose CUDA kernel is the
Python path, and calls :func:`install`: the op's CUDA calls then run the C++ kernel, which
launches a call matching an entry and hands any other call to the slow twin. After the
Python path has launched a call it calls :func:`remember` with the direct launch it used,
so the next call of that layout stays in C++.

What the C++ entry checks is what the Python direct path's signature checks: every
tensor's device, dtype, sizes and strides and its pointer's 16-byte alignment, and the
current CUDA context (the launch's device). What it cannot see: a Triton launch hook (a
profiler) installed later, which the C++ launches bypass -- set ``KDISPATCH_FAST_OPS=0``
while profiling with one; and the dispatcher's state, which is why :func:`forget` runs on
every ``reset_dispatcher()``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from kdispatch.memo import BEFORE_STATS, ON_RESET
from kdispatch.native.build import load, ops

__all__ = ["add_launch", "entries", "forget", "install", "installed", "remember",
           "slots_of"]

_INSTALLED: set[str] = set()
#: native entry id -> the dispatcher memo entry whose ``calls`` counts its hits
_COUNTERS: dict[int, Any] = {}
_LOCK = threading.Lock()
_INT_TYPES = frozenset({"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"})


def install(op: str, slow: str, n_tensors: int, dispatch_key: str = "CUDA") -> bool:
    """Put the C++ kernel on ``op`` (``ns::name``, its default overload) at
    ``dispatch_key``; calls it cannot launch go to ``slow`` (same schema). False when the
    library is not loaded or the install fails (the caller registers its Python kernel)."""
    if not load():
        return False
    with _LOCK:
        if op in _INSTALLED:
            return True
        try:
            ops().install(op, slow, n_tensors, dispatch_key)
        except Exception:  # noqa: BLE001 - the caller keeps the Python kernel
            return False
        _INSTALLED.add(op)
        return True


def installed(op: str) -> bool:
    return op in _INSTALLED


def slots_of(compiled: Any, args: Sequence[Any]) -> tuple[list[int], list[int]] | None:
    """The kernel parameters of a launch of ``compiled`` as native slots: ``kinds`` (a
    tensor's index, or -1 for a constant) and ``values`` (the constants), in the order of
    the compiled launcher's parameters, Triton's two scratch pointers (null) last.

    ``args`` are the launch's runtime arguments in the kernel's parameter order, a tensor
    given as ``("tensor", index)``. None when the launch needs what the native launch does
    not do (clusters, cooperative grids, scratch buffers, a float argument).
    """
    md = compiled.metadata
    if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0)):
        return None
    types = list(compiled.src.signature.values())
    if len(types) < len(args) or any(t != "constexpr" for t in types[len(args):]):
        return None
    kinds: list[int] = []
    values: list[int] = []
    for ty, arg in zip(types, args):
        if ty == "constexpr":
            continue
        is_tensor = isinstance(arg, tuple) and arg[:1] == ("tensor",)
        if ty.startswith("*") and is_tensor:
            kinds.append(int(arg[1]))
            values.append(0)
        elif ty in _INT_TYPES and isinstance(arg, int) and not is_tensor:
            kinds.append(-1)
            values.append(int(arg) - (1 << 64) if arg >= 1 << 63 else int(arg))
        else:
            return None
    kinds += [-1, -1]  # global_scratch, profile_scratch: none
    values += [0, 0]
    return kinds, values


def add_launch(op: str, tensors: Sequence[Any], compiled: Any, function: int,
               grid: Sequence[int], args: Sequence[Any], counter: Any = None) -> int | None:
    """Hand the native cache one launch of ``op``: ``tensors`` the call's tensors (their
    layouts become the entry's check), ``compiled`` / ``function`` / ``grid`` the direct
    launch, ``args`` as for :func:`slots_of`. ``counter`` (a memo entry) gets its hits.
    The entry's id, or None when refused."""
    if op not in _INSTALLED:
        return None
    slots = slots_of(compiled, args)
    if slots is None:
        return None
    md = compiled.metadata
    g = (tuple(int(x) for x in grid) + (1, 1, 1))[:3]
    launch = [*g, 32 * int(md.num_warps), int(md.shared), int(bool(md.launch_pdl))]
    eid = int(ops().add(op, list(tensors), int(function), launch, *slots))
    if eid < 0:
        return None
    if counter is not None:
        with _LOCK:
            _COUNTERS[eid] = counter
    return eid


def remember(op: str, tensors: Sequence[Any], direct: Any, tensor_args: Sequence[int],
             tail: Sequence[int], counter: Any = None) -> int | None:
    """:func:`add_launch` for a :class:`kdispatch.launching.DirectLaunch` whose launch
    passes the tensors ``tensor_args`` (indices into ``tensors``) then the integers
    ``tail``."""
    args = [("tensor", i) for i in tensor_args] + list(tail)
    return add_launch(op, tensors, direct.compiled, direct.function,
                      (direct.g0, direct.g1, direct.g2), args, counter)


def entries(op: str) -> int:
    """How many launches the native cache holds for ``op`` (-1: not installed)."""
    return int(ops().entries(op)) if op in _INSTALLED else -1


def _fold_counts() -> None:
    if not _INSTALLED:
        return
    flat = ops().take_counts()
    with _LOCK:
        for i in range(0, len(flat), 2):
            counter = _COUNTERS.get(int(flat[i]))
            if counter is not None:
                counter.calls += int(flat[i + 1])


def forget() -> None:
    """Drop every native entry (the dispatcher was reset: configs may differ now)."""
    if not _INSTALLED:
        return
    _fold_counts()
    ops().clear()
    with _LOCK:
        _COUNTERS.clear()


BEFORE_STATS.append(_fold_counts)
ON_RESET.append(forget)
