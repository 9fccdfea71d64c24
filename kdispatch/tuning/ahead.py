"""The sweep's side of compiling ahead: describe every candidate, submit, wait per candidate.

Before the first candidate is timed, :meth:`CompileAhead.submit` makes each key's inputs
once on the tuning device, asks the op for every candidate's launches
(:meth:`~kdispatch.opdef.OpTuning.launches`), turns them into
:class:`~kdispatch.tuning.precompile.LaunchSpec` items and submits them to a compile pool
in the order the sweep will time them, so the pool runs ahead of the timing. Before a
candidate is verified, :meth:`CompileAhead.ready` waits for its kernels (moving them to the
front of the queue): the JIT call that follows only loads them from the Triton cache. A
kernel the compiler rejected makes the candidate infeasible without a launch; anything the
pool could not do (a launch it could not describe, a kernel it skipped) is compiled by the
JIT at launch, exactly as without a pool. Verification and timing are untouched.

Inputs that were slow to make (drawn on the host: seconds for a large KV write) are kept,
within :data:`KEEP_BYTES`, for the sweep to verify and time on (:meth:`CompileAhead.
take_inputs`), so such a key's inputs are made once per run instead of twice.

The pool is a local :class:`~kdispatch.tuning.compile_pool.CompilePool` or, in a worker of
``--device all``, a :class:`RemotePool` that forwards to the one pool the parent process
owns for the whole host (so two GPUs never compile one variant twice).
"""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kdispatch.store import MeasurementIn
from kdispatch.tuning.compile_pool import CompilePool, PoolStats
from kdispatch.tuning.inputs import storage_bytes
from kdispatch.tuning.precompile import (DEFAULT_COMPILER, LaunchSpec, Outcome, Target,
                                         current_target, default_workers, describe)
from kdispatch.tuning.throughput import Throughput

log = logging.getLogger(__name__)

#: how often a waiting sweep reports progress
POLL_S = 0.25
#: a candidate waits at most this long for its kernels; then its launch compiles them (a
#: kernel takes seconds to compile: only a pool that lost an item waits this long)
STALL_S = 900.0
#: inputs that took at least KEEP_MIN_S to make are kept for the sweep, up to KEEP_BYTES
KEEP_MIN_S, KEEP_BYTES = 0.05, 4 << 30


class Pool(Protocol):
    """What :class:`CompileAhead` needs of a compile pool."""

    def submit(self, items: Iterable[tuple[str, LaunchSpec]]) -> None: ...

    def prioritize(self, ids: Sequence[str]) -> None: ...

    def wait(self, ids: Sequence[str], timeout: float | None = None
             ) -> dict[str, Outcome]: ...

    def stats(self) -> PoolStats | None: ...


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


@dataclass(frozen=True)
class Ready:
    """Whether a candidate may run: ``go``, ``infeasible`` (with the compiler's error) or
    ``budget`` (the budget ran out while its kernels were compiling)."""

    status: Literal["go", "infeasible", "budget"]
    error: str | None = None


@dataclass
class AheadStats:
    """The timing process's side of compiling ahead."""

    describe_s: float = 0.0     # making inputs and describing launches
    wait_s: float = 0.0         # waiting for the pool before a candidate


@dataclass
class CompileAhead:
    """Compile a sweep's candidates ahead in ``pool`` for ``target`` (see the module)."""

    pool: Pool | None
    target: Target | None
    torch_device: Any
    seed: int = 0
    stats: AheadStats = field(default_factory=AheadStats)
    _ids: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    _sent: set[str] = field(default_factory=set)
    _kept: dict[int, dict[str, Any]] = field(default_factory=dict)
    _kept_bytes: int = 0

    @classmethod
    def for_run(cls, pool: Pool | None, target: Target | None, interpreter: bool,
                torch_device: Any, seed: int) -> CompileAhead:
        """The sweep's compile-ahead side; without a pool or a target (the target defaults
        to this process's GPU; the interpreter has none) it does nothing and every
        candidate is ready at once."""
        if pool is not None and target is None and not interpreter:
            target = current_target()
        if pool is None or target is None:
            return cls(None, None, torch_device, seed)
        return cls(pool, target, torch_device, seed)

    def submit(self, work: Iterable[tuple[int, Any, Any, list[tuple[str, Any]]]]) -> None:
        """Describe and submit ``(key_index, op, key, [(config_digest, config)])`` in order.

        A key whose inputs cannot be made, or a candidate whose launches cannot be
        described, is left to the JIT (the sweep meets the same call again and handles its
        error as it always did).
        """
        if self.pool is None or self.target is None:
            return
        t0 = time.monotonic()
        for ki, op, key, todo in work:
            if not todo:
                continue
            t_make = time.monotonic()
            try:
                inputs = op.tuning.make_inputs(key, self.torch_device, self.seed)
            except Exception as exc:  # noqa: BLE001 - the sweep makes them again and reports
                log.warning("%s: not compiling ahead (inputs: %s)", op.name, exc)
                continue
            self._keep(ki, inputs, time.monotonic() - t_make)
            fresh: dict[str, LaunchSpec] = {}
            for digest, cfg in todo:
                specs = self._describe(op, cfg, inputs)
                if specs:
                    self._ids[(ki, digest)] = [s.digest for s in specs]
                    fresh.update((s.digest, s) for s in specs if s.digest not in self._sent)
            del inputs
            self._sent |= set(fresh)
            self.pool.submit(list(fresh.items()))
        self.stats.describe_s += time.monotonic() - t0

    def _keep(self, key_index: int, inputs: dict[str, Any], made_s: float) -> None:
        """Keep inputs that were slow to make while they fit in KEEP_BYTES (describing a
        launch only reads them: they are as ``make_inputs`` returned them)."""
        size = storage_bytes(inputs)
        if made_s >= KEEP_MIN_S and self._kept_bytes + size <= KEEP_BYTES:
            self._kept[key_index] = inputs
            self._kept_bytes += size

    def take_inputs(self, key_index: int) -> dict[str, Any] | None:
        """The inputs of key ``key_index`` kept while describing it (once; else None)."""
        inputs = self._kept.pop(key_index, None)
        if inputs is not None:
            self._kept_bytes -= storage_bytes(inputs)
        return inputs

    def _describe(self, op: Any, cfg: Any, inputs: dict[str, Any]) -> list[LaunchSpec]:
        """The candidate's launches as specs; none when any of them cannot be described
        (then its launch compiles them all, as without a pool)."""
        try:
            launches = op.tuning.launches(cfg, inputs)
        except Exception as exc:  # noqa: BLE001 - the same call fails in the sweep, visibly
            log.debug("%s %s: launches not described: %s", op.name, cfg, exc)
            return []
        specs = [describe(launch, self.target) for launch in launches]
        return [s for s in specs if s is not None] if None not in specs else []

    def ready(self, key_index: int, digest: str, deadline: float | None = None,
              on_wait: Callable[[], None] | None = None) -> Ready:
        """Wait until the candidate's kernels are compiled (or failed, or skipped)."""
        ids = self._ids.get((key_index, digest))
        if not ids or self.pool is None:
            return Ready("go")
        t0 = time.monotonic()
        got = self.pool.wait(ids, timeout=0)
        if len(got) < len(set(ids)):
            self.pool.prioritize(ids)
        while len(got) < len(set(ids)):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.stats.wait_s += time.monotonic() - t0
                return Ready("budget")
            if time.monotonic() - t0 > STALL_S:
                log.warning("waited %.0f s for %d kernels of one candidate; compiling them "
                            "at launch", STALL_S, len(set(ids)) - len(got))
                break
            got = self.pool.wait(ids, timeout=POLL_S if left is None else min(POLL_S, left))
            if on_wait is not None and len(got) < len(set(ids)):
                on_wait()
        self.stats.wait_s += time.monotonic() - t0
        for vid in ids:
            o = got.get(vid)
            if o is not None and o.status == "failed" and o.infeasible:
                return Ready("infeasible", o.error)
        return Ready("go")

    def account(self, thr: Throughput) -> None:
        """Add this side's figures (and a local pool's) to a run's :class:`Throughput`;
        warn about kernels the timing process had to compile itself after all."""
        if self.pool is None:
            return
        if thr.jit_compiled:
            log.warning("the JIT compiled %d kernels the compile pool had not (%s): their "
                        "launches were not described, not compiled, or specialized "
                        "differently", thr.jit_compiled, ", ".join(thr.jit_names[:5]))
        thr.describe_s, thr.wait_s = self.stats.describe_s, self.stats.wait_s
        pool = self.pool.stats()
        thr.pool = pool.as_dict() if pool is not None else None


def rejected_row(op: str, config: Any, role: str, source_hash: str, key: dict[str, Any],
                 error: str | None) -> MeasurementIn:
    """The row of a candidate whose kernel the pool's compiler rejected: infeasible, never
    launched, the compiler's one-line error (as the sweep records a launch's)."""
    return MeasurementIn(op=op, key=key, config=config.model_dump(mode="json"),
                         source_hash=source_hash, status="infeasible", verified=False,
                         is_heuristic=role == "heuristic", is_baseline=role == "baseline",
                         error=error)


class RemotePool:
    """A worker's handle on the pool its parent process owns (``--device all``).

    Requests go up the worker's event queue as ``("compile", index, items)`` and
    ``("prioritize", index, ids)``; outcomes come back on the worker's own reply queue as
    ``(id, outcome)`` pairs (see :func:`kdispatch.tuning.jobs.run_local`).
    """

    def __init__(self, events: Any, replies: Any, index: int):
        self.events, self.replies, self.index = events, replies, index
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
