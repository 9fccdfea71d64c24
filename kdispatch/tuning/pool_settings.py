"""How a tuning run compiles ahead, and how its compile pool's processes start.

This module is light on purpose (no torch, no database, no op): the CLI opens the compile
pool with it before it imports the tuner, so the pool's processes start while the tuner's
process imports torch and sets up its GPU.

How the pool's processes start (forked from a fork server that imported what a compile
needs once) is :mod:`kdispatch.tuning.pool_start`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kdispatch.tuning.compile_pool import CompilePool
from kdispatch.tuning.precompile import DEFAULT_COMPILER, Target, default_workers


@dataclass(frozen=True)
class CompileSettings:
    """How a tuning run compiles ahead (picklable: it travels to worker processes).

    Attributes
    ----------
    workers : int or None
        Pool processes; None sizes the pool to the CPU cores less one per timing process;
        0 turns compiling ahead off.
    compiler : str
        ``"module:function"`` of the pool's compiler (tests pass a fake).
    target : tuple or None
        (backend, arch, warp size) to compile for; None: the timing GPU's own target, and
        nothing under the Triton interpreter (which compiles nothing).
    """

    workers: int | None = None
    compiler: str = DEFAULT_COMPILER
    target: Target | None = None

    def pool_size(self, timing_processes: int = 1) -> int:
        if self.workers is None:
            return default_workers(timing_processes)
        return max(0, self.workers)

    def applies(self, interpreter: bool) -> bool:
        """Whether a run on these devices compiles ahead at all."""
        return self.workers != 0 and (not interpreter or self.target is not None)

    def workers_for(self, timing_processes: int, interpreter: bool) -> int:
        """Pool processes a run of ``timing_processes`` workers gets (0: no pool)."""
        return self.pool_size(timing_processes) if self.applies(interpreter) else 0


@contextmanager
def open_pool(settings: CompileSettings | None, *, interpreter: bool,
              timing_processes: int = 1) -> Iterator[CompilePool | None]:
    """A :class:`CompilePool` for ``settings`` (closed on exit), or None when off."""
    if settings is None or not settings.applies(interpreter):
        yield None
        return
    pool = CompilePool(settings.pool_size(timing_processes), compiler=settings.compiler)
    try:
        yield pool
    finally:
        pool.close()
