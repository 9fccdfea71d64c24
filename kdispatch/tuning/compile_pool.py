"""A pool of compiler processes that warms the shared Triton cache ahead of the timing.

:class:`CompilePool` starts ``workers`` processes (forked from a fork server or spawned,
never forked from the owner, whose timing may hold a CUDA context:
:mod:`kdispatch.tuning.pool_start`) and feeds them :class:`~kdispatch.tuning.precompile.LaunchSpec` items
first in, first out, each variant once (items are keyed by the spec's digest; a second
submit of a key only adds a callback). Every process has its own pipe, so a process that
dies (killed, out of memory, a compiler crash) takes nothing down with it: the dispatcher
thread sees its exit, starts a replacement and gives the item it held to another process;
an item that killed ``max_attempts`` processes is a failed, infeasible compile (the
compiler cannot build it here). Processes that die before they are ready (a broken
environment) stop the pool after a few tries: what is left is ``skipped``, and the timing
process's JIT compiles it as it would without a pool.

The processes ignore SIGINT (the owner shuts them down on Ctrl-C) and exit when their
owner dies (their pipe closes). Nothing here names an op.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Self

from kdispatch.tuning.pool_start import pool_context
from kdispatch.tuning.precompile import (DEFAULT_COMPILER, LaunchSpec, Outcome, load_compiler,
                                         warm_up)

log = logging.getLogger(__name__)

OnDone = Callable[[str, Outcome], None]
#: processes that die before they are ready stop the pool after this many
START_FAILURES = 3


@dataclass
class PoolStats:
    """What the pool did so far."""

    workers: int = 0
    submitted: int = 0
    compiled: int = 0
    cache_hits: int = 0
    failed: int = 0
    skipped: int = 0
    launchers: int = 0
    cpu_s: float = 0.0      # compiler time summed over the processes
    wall_s: float = 0.0     # first submit to the last outcome
    restarts: int = 0       # processes that died and were replaced

    @property
    def done(self) -> int:
        return self.compiled + self.failed + self.skipped

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def serve(conn: Any, compiler_path: str, env: dict[str, str] | None = None) -> None:
    """A pool process: compile what arrives on ``conn`` until None or the pipe closes.

    ``env``: the owner's environment (a fork server's child has the server's, maybe older)."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.environ.pop("TRITON_INTERPRET", None)  # compiling needs compiled-mode jit functions
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        compiler = load_compiler(compiler_path)
        if compiler_path == DEFAULT_COMPILER:
            warm_up()  # what the first item would import: before it, not in its way
    except BaseException as exc:  # noqa: BLE001 - reported to the owner, then exit
        conn.send(("dead", _one_line(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the owner is gone
        if msg is None:
            return
        vid, spec = msg
        try:
            outcome = compiler(spec)
        except Exception as exc:  # noqa: BLE001 - a compiler must not kill the process
            outcome = Outcome("skipped", _one_line(exc))
        try:
            conn.send(("done", vid, outcome))
        except (OSError, ValueError):
            return


class _Proc:
    def __init__(self, process: Any, conn: Any):
        self.process, self.conn = process, conn
        self.ready = False
        self.current: str | None = None


class CompilePool:
    """Compile :class:`LaunchSpec` items in ``workers`` processes (see the module docstring).

    Parameters
    ----------
    workers : int
        Processes (at least 1); the pool's thread starts them at once, one after another
        (the caller never waits for them), so their imports (torch, Triton's compiler, the
        built-in ops with the default compiler) overlap the caller's work.
    compiler : str
        ``"module:function"`` taking a LaunchSpec and returning an Outcome (tests pass a
        fake; the default compiles with Triton).
    max_attempts : int
        Processes an item may kill before it is recorded as a failed compile.
    context : multiprocessing context, optional
        Where processes start from (default: :func:`~kdispatch.tuning.pool_start.
        pool_context`, a preloaded fork server where there is one).
    """

    def __init__(self, workers: int, *, compiler: str = DEFAULT_COMPILER,
                 max_attempts: int = 2, context: Any = None):
        if workers < 1:
            raise ValueError(f"workers: need at least 1, got {workers}")
        self._ctx = context if context is not None else pool_context()
        self._env = dict(os.environ)
        self.workers = workers
        self._compiler = compiler
        self._max_attempts = max_attempts
        self._cond = threading.Condition()
        self._pending: deque[str] = deque()
        self._specs: dict[str, LaunchSpec] = {}
        self._outcomes: dict[str, Outcome] = {}
        self._callbacks: dict[str, list[OnDone]] = {}
        self._attempts: dict[str, int] = {}
        self._procs: list[_Proc] = []
        self._start_failures = 0
        self._start_error: str | None = None
        self._broken: str | None = None
        self._due: list[tuple[str, Outcome, list[OnDone]]] = []
        self._closed = False
        self._t_first: float | None = None
        self._t_last: float | None = None
        self._stats = PoolStats(workers=workers)
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self._thread = threading.Thread(target=self._run, name="kdispatch-compile-pool",
                                        daemon=True)
        self._thread.start()

    # -- the owner's side ----------------------------------------------------------------------
    def submit(self, items: Iterable[tuple[str, LaunchSpec]],
               on_done: OnDone | None = None) -> None:
        """Queue ``(id, spec)`` items (each id compiles once); ``on_done(id, outcome)`` is
        called from the pool's thread, or at once for an id already done."""
        now: list[tuple[str, Outcome]] = []
        with self._cond:
            for vid, spec in items:
                if vid in self._outcomes:
                    now.append((vid, self._outcomes[vid]))
                    continue
                if on_done is not None:
                    self._callbacks.setdefault(vid, []).append(on_done)
                if vid in self._specs:
                    continue
                if self._t_first is None:
                    self._t_first = time.monotonic()
                self._specs[vid] = spec
                self._stats.submitted += 1
                if self._broken is not None or self._closed:
                    self._finish(vid, Outcome("skipped", self._broken or "the compile pool "
                                              "was closed"))
                else:
                    self._pending.append(vid)
        self._wake()
        self._drain()
        if on_done is not None:
            for vid, outcome in now:
                on_done(vid, outcome)

    def prioritize(self, ids: Sequence[str]) -> None:
        """Move the still queued ``ids`` to the front (the timing process waits for them)."""
        with self._cond:
            queued = set(self._pending)
            front = [v for v in dict.fromkeys(ids) if v in queued]
            if not front:
                return
            rest = [v for v in self._pending if v not in set(front)]
            self._pending = deque(front + rest)

    def wait(self, ids: Sequence[str], timeout: float | None = None) -> dict[str, Outcome]:
        """The outcomes of ``ids`` that are done once all are, or ``timeout`` seconds pass."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                got = {v: self._outcomes[v] for v in ids if v in self._outcomes}
                left = None if end is None else end - time.monotonic()
                if len(got) == len(set(ids)) or (left is not None and left <= 0):
                    return got
                self._cond.wait(timeout=1.0 if left is None else min(left, 1.0))

    def stats(self) -> PoolStats:
        with self._cond:
            s = PoolStats(**self._stats.as_dict())
            if self._t_first is not None:
                busy = len(self._outcomes) < len(self._specs)
                end = time.monotonic() if busy or self._t_last is None else self._t_last
                s.wall_s = end - self._t_first
            return s

    def close(self) -> None:
        """Stop the processes (an item being compiled is abandoned) and the thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for vid in list(self._pending):
                self._finish(vid, Outcome("skipped", "the compile pool was closed"))
            self._pending.clear()
            for p in self._procs:
                if p.current is not None and p.current not in self._outcomes:
                    self._finish(p.current, Outcome("skipped", "the compile pool was closed"))
        self._drain()
        self._wake()
        self._thread.join(timeout=10)
        # idle, or compiling what nobody waits for: stopped at once (Triton writes its
        # cache atomically), not after their interpreters' shutdown (~0.5 s with torch)
        for p in self._procs:
            p.process.terminate()
        for p in self._procs:
            p.process.join(timeout=5)
        for p in self._procs:
            p.conn.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the dispatcher thread -----------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send_bytes(b"w")
        except (OSError, ValueError):
            pass

    def _spawn(self) -> None:
        """Start one process (in the pool's thread, without the lock: the first start from a
        fork server waits for the server's imports)."""
        mine, theirs = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=serve, args=(theirs, self._compiler, self._env),
                                 name="kdispatch-compile", daemon=True)
        try:
            proc.start()
        finally:
            theirs.close()
        with self._cond:
            self._procs.append(_Proc(proc, mine))

    def _short(self) -> bool:  # start a process now? (lock held)
        return not self._closed and self._broken is None and len(self._procs) < self.workers

    def _drain(self) -> None:
        """Run the callbacks of outcomes recorded so far (never with the lock held)."""
        with self._cond:
            due, self._due = self._due, []
        for vid, outcome, callbacks in due:
            for cb in callbacks:
                try:
                    cb(vid, outcome)
                except Exception:  # noqa: BLE001 - a subscriber's problem, not the pool's
                    log.exception("compile pool callback failed")

    def _finish(self, vid: str, outcome: Outcome) -> None:
        """Record an outcome (lock held); :meth:`_drain` runs its callbacks."""
        self._outcomes[vid] = outcome
        self._t_last = time.monotonic()
        s = self._stats
        if outcome.status == "compiled":
            s.compiled += 1
            s.cache_hits += outcome.cache_hit
            s.launchers += outcome.launcher
        elif outcome.status == "failed":
            s.failed += 1
        else:
            s.skipped += 1
        s.cpu_s += outcome.seconds
        self._due.append((vid, outcome, self._callbacks.pop(vid, [])))
        self._cond.notify_all()

    def _run(self) -> None:
        from multiprocessing.connection import wait

        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    self._assign()
                    short = self._short()
                    watch = [self._wake_r] + [p.conn for p in self._procs] \
                        + [p.process.sentinel for p in self._procs]
                if short:  # one at a time, reading what the started ones sent in between
                    self._spawn()
                ready = wait(watch, timeout=0 if short else 1.0)
                with self._cond:
                    if self._wake_r in ready:
                        while self._wake_r.poll():
                            self._wake_r.recv_bytes()
                    for p in list(self._procs):
                        if p.conn in ready or p.process.sentinel in ready:
                            self._read(p)
                        if p.process.sentinel in ready:
                            self._died(p)
                self._drain()
        except BaseException as exc:
            log.exception("compile pool dispatcher failed")
            with self._cond:
                self._give_up(f"the compile pool failed: {_one_line(exc)}")
            self._drain()

    def _assign(self) -> None:
        for p in self._procs:
            if not p.ready or p.current is not None:
                continue
            while self._pending and self._pending[0] in self._outcomes:
                self._pending.popleft()
            if not self._pending:
                return
            vid = self._pending.popleft()
            try:
                p.conn.send((vid, self._specs[vid]))
                p.current = vid
            except (OSError, ValueError):
                self._pending.appendleft(vid)  # its sentinel reports the death

    def _read(self, p: _Proc) -> None:
        try:
            while p.conn.poll():
                msg = p.conn.recv()
                if msg[0] == "ready":
                    p.ready = True
                elif msg[0] == "done":
                    _, vid, outcome = msg
                    p.current = None
                    if vid not in self._outcomes:
                        self._finish(vid, outcome)
                elif msg[0] == "dead":
                    log.warning("a compile process could not start: %s", msg[1])
                    self._start_error = msg[1]
        except (EOFError, OSError):
            pass

    def _died(self, p: _Proc) -> None:
        p.process.join(timeout=1)
        code = p.process.exitcode
        self._procs.remove(p)
        p.conn.close()
        if self._closed:
            return
        if p.current is not None:
            vid = p.current
            self._attempts[vid] = self._attempts.get(vid, 0) + 1
            if self._attempts[vid] >= self._max_attempts:
                self._finish(vid, Outcome(
                    "failed", f"CompilerCrash: {self._attempts[vid]} compile processes died "
                              f"compiling {self._specs[vid].name} (last exit code {code})",
                    infeasible=True))
            else:
                self._pending.appendleft(vid)
        if not p.ready:
            self._start_failures += 1
            if self._start_failures >= START_FAILURES:
                reason = self._start_error or f"exit code {code}"
                self._give_up(f"compile processes die at start ({reason})")
                return
        self._stats.restarts += 1
        log.info("a compile process exited (code %s); starting another", code)

    def _give_up(self, reason: str) -> None:
        """No more compiling: every item not done is skipped (lock held)."""
        self._broken = reason
        for vid in list(self._pending) + [p.current for p in self._procs if p.current]:
            if vid not in self._outcomes:
                self._finish(vid, Outcome("skipped", reason))
        self._pending.clear()
        for p in self._procs:
            p.current = None
