"""The sweep's side of compiling ahead: describe keys for the pool as the timing goes.

The sweep gives :meth:`CompileAhead.plan` its keys in the order it will time them; nothing
is described yet. A key is *described* by making its inputs once on the tuning device,
asking the op for every candidate's launches (:meth:`~kdispatch.opdef.OpTuning.launches`)
and submitting them as :class:`~kdispatch.tuning.precompile.LaunchSpec` items to a compile
pool, which compiles them first in, first out. The timing starts at once and the describing
is fitted around it, so compiling overlaps timing instead of preceding it:

- :meth:`CompileAhead.own` describes the key about to be timed if it was not described yet
  (its inputs are kept for the sweep);
- :meth:`CompileAhead.ready` waits for one candidate's own kernels (moving them to the
  front of the queue); while it waits, and only while fewer of this process's kernels are
  queued or compiling than the pool has processes, it describes the next keys, checking
  before each one that the candidate's kernels are not done yet;
- :meth:`CompileAhead.top_up` describes one more key before a candidate when fewer of this
  process's kernels are queued or compiling than the pool has processes.

So the keys are submitted in timing order, a candidate waits only for its own kernels, and
the pool keeps compiling later keys while earlier ones are timed. Describing is the timing
process's own work and cannot be cut short (a large key's inputs can take a second to
make): a wait describes what keeps the pool busy, not every key it could, so a candidate
whose kernels are done starts at once instead of after a describe the pool did not need. Workers sharing one pool
(``--device all``) feed it each key once, in the shared key order (``first`` in
:meth:`CompileAhead.plan`), and each describes the keys it claims for timing itself (the
pool compiles a kernel once, whoever asked first). A worker claims the keys it described
ahead before the others (:func:`turns`), so a key's inputs are made (and its launches
described) by one worker, not once to feed the pool and again to time it. A kernel the
compiler rejected makes the candidate infeasible without a launch; anything the pool could
not do (a launch it could not describe, a kernel it skipped) is compiled by the JIT at
launch, exactly as without a pool. Verification and timing are untouched.

Inputs that were slow to make (drawn on the host: seconds for a large KV write) are kept,
within :data:`KEEP_BYTES`, for the sweep to verify and time on (:meth:`CompileAhead.
take_inputs`), so such a key's inputs are made once per run instead of twice.

The pool is a local :class:`~kdispatch.tuning.compile_pool.CompilePool` or, in a worker of
``--device all``, a :class:`~kdispatch.tuning.remote_pool.RemotePool` that forwards to the
one pool the parent process owns for the whole host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kdispatch.store import MeasurementIn
from kdispatch.tuning.compile_pool import PoolStats
from kdispatch.tuning.inputs import storage_bytes
from kdispatch.tuning.pool_settings import CompileSettings, open_pool
from kdispatch.tuning.precompile import LaunchSpec, Outcome, Target, current_target, describe
from kdispatch.tuning.throughput import Throughput

log = logging.getLogger(__name__)

__all__ = ["AheadStats", "CompileAhead", "CompileSettings", "Pool", "Ready", "open_pool",
           "rejected_row", "turns"]

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
    #: processes of the pool: :meth:`top_up` keeps at least this many kernels in it
    workers: int = 1
    stats: AheadStats = field(default_factory=AheadStats)
    _work: dict[int, tuple[Any, Any, list[tuple[str, Any]]]] = field(default_factory=dict)
    _order: list[int] = field(default_factory=list)
    _next: int = 0
    _first: Callable[[int], bool] | None = None
    _fed: set[int] = field(default_factory=set)
    _ids: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    _sent: set[str] = field(default_factory=set)
    _open: set[str] = field(default_factory=set)
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
        return cls(pool, target, torch_device, seed, workers=max(1, int(getattr(
            pool, "workers", 1) or 1)))

    @property
    def active(self) -> bool:
        return self.pool is not None and self.target is not None

    def plan(self, work: Iterable[tuple[int, Any, Any, list[tuple[str, Any]]]],
             first: Callable[[int], bool] | None = None) -> None:
        """Take ``(key_index, op, key, [(config_digest, config)])`` in timing order.

        Nothing is described here. ``first(key_index)``, when given, is asked before this
        process describes a key ahead for a pool it shares with other workers: False means
        another worker fed that key (or claimed it for timing) already.
        """
        if not self.active:
            return
        for ki, op, key, todo in work:
            if todo and ki not in self._work:
                self._work[ki] = (op, key, list(todo))
                self._order.append(ki)
        self._first = first

    def submit(self, work: Iterable[tuple[int, Any, Any, list[tuple[str, Any]]]]) -> None:
        """Plan ``work`` and describe all of it now (a caller that times nothing)."""
        self.plan(work)
        while self.feed():
            pass

    def own(self, key_index: int) -> None:
        """Describe key ``key_index`` now unless this process described it already (before
        its candidates wait for their kernels); its inputs are kept for the sweep. A key
        whose inputs cannot be made, or a candidate whose launches cannot be described, is
        left to the JIT (the sweep meets the same call again and reports its error)."""
        if self.active and key_index in self._work and key_index not in self._fed:
            self._describe(key_index, now=True)

    def feed(self, deadline: float | None = None) -> bool:
        """Describe the next key in timing order that is not described yet; False when
        none is left or the budget is spent."""
        while self.active and self._next < len(self._order):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            ki = self._order[self._next]
            self._next += 1
            if ki in self._fed or ki not in self._work:
                continue
            if self._first is not None and not self._first(ki):
                continue
            self._describe(ki, now=False)
            return True
        return False

    def top_up(self, deadline: float | None = None) -> None:
        """Describe one more key when fewer of this process's kernels are queued or
        compiling than the pool has processes (so none of them runs dry)."""
        if self.active and self._next < len(self._order) and self._backlog() < self.workers:
            self.feed(deadline)

    def described(self, key_index: int) -> bool:
        """Whether this process described key ``key_index`` (its inputs may be kept)."""
        return key_index in self._fed and key_index in self._work

    def forget(self, key_index: int) -> None:
        """Key ``key_index`` is done here, or another worker times it: drop its kept
        inputs and describe it no more."""
        self.take_inputs(key_index)
        self._work.pop(key_index, None)

    def _backlog(self) -> int:
        if self._open and self.pool is not None:
            self._open.difference_update(self.pool.wait(list(self._open), timeout=0))
        return len(self._open)

    def _describe(self, key_index: int, now: bool) -> None:
        """Make the key's inputs, describe its candidates, submit their new kernels.

        ``now``: the sweep times this key next (its inputs are kept whatever their size;
        a failure is final). Otherwise a key whose inputs cannot be made now (say, no
        device memory beside the inputs of the key being timed) is described when its
        turn comes.
        """
        op, key, todo = self._work[key_index]
        t0 = time.monotonic()
        found: dict[str, list[LaunchSpec]] | None = None
        try:
            inputs = op.tuning.make_inputs(key, self.torch_device, self.seed)
            made_s = time.monotonic() - t0
            found = {digest: self._describe_one(op, cfg, inputs) for digest, cfg in todo}
        except Exception as exc:  # noqa: BLE001 - the sweep makes them again and reports
            if now:
                log.warning("%s: not compiling this key ahead (%s)", op.name, exc)
                self._fed.add(key_index)
            else:
                log.debug("%s: not described ahead (%s); described at its turn", op.name,
                          exc)
            inputs = None
        if inputs is None or found is None:
            if not now:
                self._release()
            self.stats.describe_s += time.monotonic() - t0
            return
        self._fed.add(key_index)
        self._keep(key_index, inputs, made_s, always=now)
        del inputs
        fresh: dict[str, LaunchSpec] = {}
        for digest, specs in found.items():
            if specs:
                ids = [s.digest for s in specs]
                self._ids[(key_index, digest)] = ids
                self._open.update(ids)
                fresh.update((s.digest, s) for s in specs if s.digest not in self._sent)
        self._sent |= set(fresh)
        if fresh and self.pool is not None:
            self.pool.submit(list(fresh.items()))
        self.stats.describe_s += time.monotonic() - t0

    def _release(self) -> None:
        """Give cached device memory back after inputs could not be made."""
        if getattr(self.torch_device, "type", None) == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _keep(self, key_index: int, inputs: dict[str, Any], made_s: float,
              always: bool = False) -> None:
        """Keep inputs that were slow to make while they fit in KEEP_BYTES, or ``always``
        (describing a launch only reads them: they are as ``make_inputs`` returned them)."""
        size = storage_bytes(inputs)
        if always or (made_s >= KEEP_MIN_S and self._kept_bytes + size <= KEEP_BYTES):
            self.take_inputs(key_index)
            self._kept[key_index] = inputs
            self._kept_bytes += size

    def take_inputs(self, key_index: int) -> dict[str, Any] | None:
        """The inputs of key ``key_index`` kept while describing it (once; else None)."""
        inputs = self._kept.pop(key_index, None)
        if inputs is not None:
            self._kept_bytes -= storage_bytes(inputs)
        return inputs

    def _describe_one(self, op: Any, cfg: Any, inputs: dict[str, Any]) -> list[LaunchSpec]:
        """The candidate's launches as specs; none when any of them cannot be described
        (then its launch compiles them all, as without a pool)."""
        try:
            launches = op.tuning.launches(cfg, inputs)
        except Exception as exc:  # noqa: BLE001 - the same call fails in the sweep, visibly
            import torch

            if isinstance(exc, torch.cuda.OutOfMemoryError):
                raise  # the whole key is described again (or left to the JIT)
            log.debug("%s %s: launches not described: %s", op.name, cfg, exc)
            return []
        specs = [describe(launch, self.target) for launch in launches]
        return [s for s in specs if s is not None] if None not in specs else []

    def ready(self, key_index: int, digest: str, deadline: float | None = None,
              on_wait: Callable[[], None] | None = None) -> Ready:
        """Wait until the candidate's kernels are compiled (or failed, or skipped).

        While it waits it describes later keys for the pool, one at a time, but only
        while fewer of this process's kernels are queued or compiling than the pool has
        processes (the pool would otherwise run dry), and never once the candidate's own
        kernels are done: their readiness is checked before each describe. A describe
        cannot be cut short (making a large key's inputs can take a second), so one
        started for a pool that is busy anyway only delays this candidate; the keys not
        described here are described by :meth:`top_up` as the pool drains, or at their
        turn (:meth:`own`).
        """
        ids = self._ids.get((key_index, digest))
        if not ids or self.pool is None:
            return Ready("go")
        need = len(set(ids))
        t0 = time.monotonic()
        shown = t0 - POLL_S
        described = self.stats.describe_s
        got = self.pool.wait(ids, timeout=0)
        if len(got) < need:
            self.pool.prioritize(ids)
        try:
            while len(got) < need:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return Ready("budget")
                if time.monotonic() - t0 > STALL_S:
                    log.warning("waited %.0f s for %d kernels of one candidate; compiling "
                                "them at launch", STALL_S, need - len(got))
                    break
                if on_wait is not None and time.monotonic() - shown >= POLL_S:
                    on_wait()
                    shown = time.monotonic()
                if self._backlog() < self.workers:  # the pool is running dry
                    got = self.pool.wait(ids, timeout=0)
                    if len(got) >= need:
                        break  # done meanwhile: no describe in the candidate's way
                    if self.feed(deadline):
                        got = self.pool.wait(ids, timeout=0)
                        continue
                got = self.pool.wait(ids, timeout=POLL_S if left is None
                                     else min(POLL_S, left))
        finally:
            self._open.difference_update(got)
            self.stats.wait_s += time.monotonic() - t0 - (self.stats.describe_s - described)
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


def turns(count: int, claim: Callable[[int], bool] | None, ahead: CompileAhead
          ) -> Iterator[int]:
    """The keys ``0..count-1`` a sweep times, in its order: all of them in order without
    ``claim``; with it (workers sharing one key list) the next key this worker can claim,
    asked first among the keys it described ahead itself (their inputs are made and may be
    kept, their kernels queued by it), then among the rest in order. A worker is never idle
    while a key is unclaimed, and a key another worker described is taken only when this
    one described none that is left. Keys another worker claimed are forgotten here."""
    left = list(range(count))
    while left:
        if claim is None:
            yield left.pop(0)
            continue
        mine = {i for i in left if ahead.described(i)}
        for i in sorted(mine) + [i for i in left if i not in mine]:
            left.remove(i)
            if claim(i):
                yield i
                break
            ahead.forget(i)  # another worker tunes it: drop what was kept for it


def rejected_row(op: str, config: Any, role: str, source_hash: str, key: dict[str, Any],
                 error: str | None) -> MeasurementIn:
    """The row of a candidate whose kernel the pool's compiler rejected: infeasible, never
    launched, the compiler's one-line error (as the sweep records a launch's)."""
    return MeasurementIn(op=op, key=key, config=config.model_dump(mode="json"),
                         source_hash=source_hash, status="infeasible", verified=False,
                         is_heuristic=role == "heuristic", is_baseline=role == "baseline",
                         error=error)
