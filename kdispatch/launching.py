"""The host path below a Triton JIT call: launch compiled kernels through their own launcher.

A ``kernel[grid](*args, **constexprs)`` call binds its arguments, computes Triton's
specialization key and looks the compiled kernel up on every call (about 8 us of a ~20 us
launch on an H200's host). An op that has already checked a call's signature (shapes,
strides, dtypes, devices, pointer alignment: everything Triton specializes on) keeps the
:class:`DirectLaunch` it got from the first JIT call for that signature and launches it
directly: pointers as integers, the grid precomputed, the constexprs compiled in.

Only on a GPU: under the Triton interpreter every launch goes through the JIT call, and
while a launch hook is installed (profilers) so do all launches, so the hooks see them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DirectLaunch", "KernelLaunch", "direct_launch_enabled", "hooks_installed",
           "make_direct", "raw_stream"]


@dataclass(frozen=True)
class KernelLaunch:
    """One Triton launch as data: what ``fn[grid](*args, **constexprs, **options)`` runs.

    Ops describe their launches this way so a tuner can compile them ahead (the tensors'
    dtypes and the integers' values decide Triton's specialization) and so their own
    launch path runs exactly what was described.
    """

    fn: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def run(self) -> Any:
        """Launch through Triton's JIT; the compiled kernel (GPU) or None (interpreter)."""
        return self.fn[tuple(self.grid)](*self.args, **self.constexprs, **self.options)


def direct_launch_enabled() -> bool:
    """False under the interpreter or when ``KDISPATCH_DIRECT_LAUNCH=0``."""
    return (os.environ.get("TRITON_INTERPRET", "") != "1"
            and os.environ.get("KDISPATCH_DIRECT_LAUNCH", "1") != "0")


def _installed(hook: Any) -> bool:
    # Triton 3.6 keeps a HookChain there (never None; empty when nothing is installed)
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


_RUNTIME: Any = None  # triton.knobs.runtime, looked up once (this runs on every call)
_RAW_STREAM: Any = None


def hooks_installed() -> bool:
    """Whether a launch hook (a profiler) is installed: then every launch goes through
    Triton's JIT so the hook sees it."""
    global _RUNTIME
    rt = _RUNTIME
    if rt is None:
        from triton import knobs

        rt = _RUNTIME = knobs.runtime
    return _installed(rt.launch_enter_hook) or _installed(rt.launch_exit_hook)


def raw_stream(device_index: int) -> int:
    """The current CUDA stream of a device as an integer handle (what Triton launches on)."""
    global _RAW_STREAM
    get = _RAW_STREAM
    if get is None:
        import torch

        get = _RAW_STREAM = torch._C._cuda_getCurrentRawStream
    return get(device_index)


class DirectLaunch:
    """A compiled kernel with its grid, launched through the compiled launcher.

    Parameters
    ----------
    compiled : triton.compiler.CompiledKernel
        What the first JIT call for this signature returned.
    grid : sequence of int
    n_params : int
        The kernel's parameter count; launch values for the trailing constexpr parameters
        (passed by keyword to the JIT call) are placeholders the launcher ignores.
    n_args : int
        Positional runtime arguments each launch passes.
    """

    __slots__ = ("compiled", "launcher", "function", "packed", "g0", "g1", "g2", "pad")

    def __init__(self, compiled: Any, grid: Sequence[int], n_params: int, n_args: int):
        self.compiled = compiled
        self.launcher = compiled.run  # initializes the module and function handles
        self.function = compiled.function
        self.packed = compiled.packed_metadata
        g = tuple(grid) + (1, 1)
        self.g0, self.g1, self.g2 = int(g[0]), int(g[1]), int(g[2])
        self.pad = (None,) * (n_params - n_args)

    def __call__(self, stream: int, *args: Any) -> None:
        self.launcher(self.g0, self.g1, self.g2, stream, self.function, self.packed, None,
                      None, None, *args, *self.pad)


def make_direct(fn: Any, compiled: Any, grid: Sequence[int], n_args: int
                ) -> DirectLaunch | None:
    """A :class:`DirectLaunch` of ``compiled`` when direct launches are possible, else None."""
    if compiled is None or not direct_launch_enabled() or hooks_installed():
        return None
    return DirectLaunch(compiled, grid, len(fn.params), n_args)
