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

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kdispatch.launching import hooks_installed
from kdispatch.memo import BEFORE_STATS, ON_RESET
from kdispatch.native.build import load, ops

__all__ = ["NativeLaunch", "add_launches", "entries", "forget", "install", "installed",
           "remember", "slots_of"]

_INSTALLED: set[str] = set()
#: native entry id -> the dispatcher memo entry whose ``calls`` counts its hits
_COUNTERS: dict[int, Any] = {}
_LOCK = threading.Lock()
_INT_TYPES = frozenset({"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"})


def install(op: str, slow: str, tensor_args: Sequence[int],
            dispatch_key: str = "CUDA") -> bool:
    """Put the C++ kernel on ``op`` (``ns::name``, its default overload) at
    ``dispatch_key``; the call's tensors (what an entry checks and slots name by index) are
    its arguments at positions ``tensor_args``; calls it cannot launch go to ``slow`` (same
    schema). False when the library is not loaded or the install fails (the caller
    registers its Python kernel)."""
    if not load():
        return False
    with _LOCK:
        if op in _INSTALLED:
            return True
        try:
            ops().install(op, slow, list(tensor_args), dispatch_key)
        except Exception:  # noqa: BLE001 - the caller keeps the Python kernel
            return False
        _INSTALLED.add(op)
        return True


def installed(op: str) -> bool:
    return op in _INSTALLED


#: slot kinds of the library (launch_cache.cpp): a constant, a call tensor's index, an
#: allocation's (ALLOC + index), a float argument's (SCALAR + argument index)
CONST, ALLOC, SCALAR = -1, 1000, 2000


def _double_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _slot(ty: str, arg: Any) -> tuple[int, int] | None:
    """(kind, value) of one launcher parameter of Triton type ``ty``, or None."""
    tag = arg[0] if isinstance(arg, tuple) else None
    if ty.startswith("*"):
        if tag in ("tensor", "alloc"):
            offset = int(arg[2]) if len(arg) > 2 else 0
            return (int(arg[1]) if tag == "tensor" else ALLOC + int(arg[1])), offset
        if tag == "ptr":  # a pointer the entry keeps alive (see add_launches' keep)
            return CONST, int(arg[1])
        return None
    if ty in _INT_TYPES and isinstance(arg, int) and not isinstance(arg, bool | tuple):
        return CONST, int(arg) - (1 << 64) if arg >= 1 << 63 else int(arg)
    if ty == "fp32":
        if tag == "scalar":  # the call's float argument arg[1] times arg[2]
            return SCALAR + int(arg[1]), _double_bits(arg[2])
        if isinstance(arg, float):
            return CONST, struct.unpack("<I", struct.pack("<f", arg))[0]
    return None


def slots_of(compiled: Any, args: Sequence[Any]) -> tuple[list[int], list[int]] | None:
    """The kernel parameters of a launch of ``compiled`` as native slots: ``kinds`` and
    ``values``, in the order of the compiled launcher's parameters, Triton's two scratch
    pointers (null) last.

    ``args`` are the launch's runtime arguments in the kernel's parameter order: an
    integer or a float (a constant), ``("tensor", i[, byte offset])`` (the call's tensor
    ``i``), ``("alloc", a[, byte offset])`` (the call's allocation ``a``), ``("ptr",
    address)`` (a tensor the entry keeps), ``("scalar", i, factor)`` (the call's float
    argument ``i`` times ``factor``, as fp32). None when the launch needs what the native
    launch does not do (clusters, cooperative grids, scratch buffers, other types).
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
        slot = _slot(ty, arg)
        if slot is None:
            return None
        kinds.append(slot[0])
        values.append(slot[1])
    kinds += [CONST, CONST]  # global_scratch, profile_scratch: none
    values += [0, 0]
    return kinds, values


@dataclass(frozen=True)
class NativeLaunch:
    """One kernel launch of an entry: the compiled kernel, its CUfunction and grid, and its
    runtime arguments as :func:`slots_of` takes them."""

    compiled: Any
    function: int
    grid: Sequence[int]
    args: Sequence[Any]

    @classmethod
    def of(cls, direct: Any, args: Sequence[Any]) -> NativeLaunch:
        """From a :class:`kdispatch.launching.DirectLaunch`."""
        return cls(direct.compiled, direct.function, (direct.g0, direct.g1, direct.g2), args)


def add_launches(op: str, tensors: Sequence[Any], launches: Sequence[NativeLaunch],
                 keep: Sequence[Any] = (), allocs: Sequence[tuple[Any, Any, bool]] = (),
                 returns: int = -1, counter: Any = None) -> int | None:
    """Hand the native cache one entry of ``op``: ``tensors`` the call's tensors (their
    layouts become the entry's check), ``launches`` in order, ``keep`` tensors the launches
    read by address, ``allocs`` the buffers each call allocates as (shape, dtype, zeroed),
    ``returns`` the allocation the op returns (-1: none). ``counter`` (a memo entry) gets
    the entry's calls. The entry's id, or None when refused (also while a Triton launch
    hook is installed: the C++ launches would bypass it)."""
    if op not in _INSTALLED or hooks_installed():
        return None
    import torch

    flat: list[int] = []
    for launch in launches:
        slots = slots_of(launch.compiled, launch.args)
        if slots is None:
            return None
        md = launch.compiled.metadata
        g = (tuple(int(x) for x in launch.grid) + (1, 1, 1))[:3]
        flat += [int(launch.function), *g, 32 * int(md.num_warps), int(md.shared),
                 int(bool(md.launch_pdl)), len(slots[0]), *slots[0], *slots[1]]
    like = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype, _ in allocs]
    eid = int(ops().add(op, list(tensors), list(keep), like, [int(z) for _, _, z in allocs],
                        returns, flat))
    if eid < 0:
        return None
    if counter is not None:
        with _LOCK:
            _COUNTERS[eid] = counter
    return eid


def remember(op: str, tensors: Sequence[Any], direct: Any, tensor_args: Sequence[int],
             tail: Sequence[int], counter: Any = None) -> int | None:
    """:func:`add_launches` of one :class:`kdispatch.launching.DirectLaunch` whose launch
    passes the tensors ``tensor_args`` (indices into ``tensors``) then the integers
    ``tail``."""
    args = [("tensor", i) for i in tensor_args] + list(tail)
    return add_launches(op, tensors, [NativeLaunch.of(direct, args)], counter=counter)


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
