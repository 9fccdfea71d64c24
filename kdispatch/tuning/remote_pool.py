"""A tuning worker's handle on the compile pool its parent process owns (``--device all``).

The parent (:func:`kdispatch.tuning.jobs.run_local`) owns one
:class:`~kdispatch.tuning.compile_pool.CompilePool` for the host; each worker process talks
to it through a :class:`RemotePool`, which :class:`~kdispatch.tuning.ahead.CompileAhead`
uses like a local pool. Nothing here names an op.
"""

from __future__ import annotations

import os
import queue as queue_mod
import time
from collections.abc import Iterable, Sequence
from typing import Any

from kdispatch.tuning.compile_pool import PoolStats
from kdispatch.tuning.precompile import LaunchSpec, Outcome

#: how often a waiting worker checks that the pool's owner is still there
POLL_S = 0.25


class RemotePool:
    """A worker's handle on the pool its parent process owns.

    Requests go up the worker's event queue as ``("compile", index, items)`` and
    ``("prioritize", index, ids)``; outcomes come back on the worker's own reply queue as
    ``(id, outcome)`` pairs (see :func:`kdispatch.tuning.jobs.run_local`). ``workers`` is
    the size of the parent's pool (how many kernels keep it busy).
    """

    def __init__(self, events: Any, replies: Any, index: int, workers: int = 1):
        self.events, self.replies, self.index = events, replies, index
        self.workers = max(1, workers)
        self._got: dict[str, Outcome] = {}
        self._parent = os.getppid()

    def submit(self, items: Iterable[tuple[str, LaunchSpec]]) -> None:
        items = list(items)
        if items:
            self.events.put(("compile", self.index, items))

    def prioritize(self, ids: Sequence[str]) -> None:
        self.events.put(("prioritize", self.index, list(ids)))

    def stats(self) -> PoolStats | None:
        return None  # the owner reports the pool

    def wait(self, ids: Sequence[str], timeout: float | None = None) -> dict[str, Outcome]:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            self._drain()
            if all(v in self._got for v in ids):
                break
            if os.getppid() != self._parent:  # the pool's owner is gone: compile at launch
                for v in ids:
                    self._got.setdefault(v, Outcome("skipped", "the compile pool is gone"))
                break
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            try:
                vid, outcome = self.replies.get(timeout=POLL_S if left is None
                                                else min(POLL_S, left))
            except queue_mod.Empty:
                continue
            self._got[vid] = outcome
        return {v: self._got[v] for v in ids if v in self._got}

    def _drain(self) -> None:
        while True:
            try:
                vid, outcome = self.replies.get_nowait()
            except queue_mod.Empty:
                return
            self._got[vid] = outcome
