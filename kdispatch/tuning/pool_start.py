"""How the compile pool's processes start: forked from a fork server, or spawned.

Pool processes are forked from a fork server (``multiprocessing``'s ``forkserver``) that
imported what a compile needs (torch, Triton's compiler, the built-in ops:
:mod:`kdispatch.tuning._pool_preload`) once, instead of each importing them itself: 31
spawned processes each importing torch (~2.4 s of CPU each) kept a 32-core host's cores busy
for seconds during the very start-up the timing process and the GPU workers wait on. The
fork server is a fresh interpreter started by the pool's owner (never a fork of it, so no
CUDA context), forked from at each process start; the processes take their owner's
environment (:func:`kdispatch.tuning.compile_pool.serve`), not the server's. Where the
platform has no fork server, or ``KDISPATCH_COMPILE_START=spawn``, they are spawned.
"""

from __future__ import annotations

import os
from typing import Any

#: what the fork server imports before it forks the first pool process
PRELOAD = "kdispatch.tuning._pool_preload"
#: ``forkserver`` (the default where available) or ``spawn``
START_ENV = "KDISPATCH_COMPILE_START"


def start_method() -> str:
    """How pool processes start here: ``forkserver`` or ``spawn``."""
    import multiprocessing as mp

    asked = os.environ.get(START_ENV, "").strip().lower()
    if asked == "spawn" or "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    return "forkserver"


def pool_context() -> Any:
    """The ``multiprocessing`` context pool processes start from (a fork server is told to
    preload :data:`PRELOAD`; one already running in this process is used as it is)."""
    import multiprocessing as mp

    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([PRELOAD])
    return ctx
