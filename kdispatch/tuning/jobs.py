"""Tuning worker processes: jobs, the key-claim register, and running them on one host.

A job is one worker's device and key list; workers of one device group share a key list
and take keys on demand from a claim register (:func:`claimer`). :func:`run_local` runs
one spawned process per job, all writing to one database, and gathers how each ended;
:func:`run_shard` is the entry of a worker (processes and Ray tasks alike).

Compiling ahead, the host has one compile pool, owned by the :func:`run_local` process:
workers submit their candidates' kernels up their event queue and get the outcomes back on
a queue of their own (:class:`~kdispatch.tuning.remote_pool.RemotePool`). The pool compiles
each variant once whoever asked first, so two GPUs never compile one kernel twice and the
CPU cores go to whichever GPU needs them now. The claim register also records which keys a
worker has fed to the pool ahead (:data:`FED`): the workers feed it each key once, in the
key order they claim keys in.
"""

from __future__ import annotations

import pickle
import queue as queue_mod
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from kdispatch.device import Device
from kdispatch.registry import get_op, register
from kdispatch.tuning import sweep
from kdispatch.tuning.ahead import CompileSettings, open_pool
from kdispatch.tuning.compile_pool import PoolStats
from kdispatch.tuning.plan import TuneTarget
from kdispatch.tuning.remote_pool import RemotePool
from kdispatch.tuning.sweep import KeySummary, Progress

#: ``on_update(done, total, description)``: the aggregated progress of all workers
UpdateFn = Callable[[int, "int | None", str], None]
#: ``on_compile(stats)``: the host's compile pool, while it runs and once at the end
CompileFn = Callable[[PoolStats], None]
#: flags of a key in the claim register: claimed for timing; fed to the compile pool ahead
CLAIMED, FED = 1, 2


@dataclass(frozen=True)
class DeviceGroup:
    """Devices of one host that share a dispatch device (so they tune one table).

    Attributes
    ----------
    device : Device
        The dispatch device every worker of the group tunes for.
    names : tuple of str
        Worker device names (``"cuda:0"``, ``"cpu"``), one worker each.
    """

    device: Device
    names: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    """One worker's work: its device name and its shard of the keys."""

    index: int
    device_name: str
    device_key: str
    targets: tuple[TuneTarget, ...]
    #: the group's jobs share ``targets`` and take keys by claim (several devices)
    group: int = 0
    shared: bool = False


@dataclass
class WorkerResult:
    """How one worker ended: its counts, or the error that stopped it."""

    index: int
    device_name: str
    counts: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class GroupRun:
    """The planned keys of one device group and, after the run, their summaries."""

    group: DeviceGroup
    targets: list[TuneTarget]
    notes: list[str] = field(default_factory=list)
    summaries: list[KeySummary] = field(default_factory=list)


def make_jobs(runs: Sequence[GroupRun], *, on_demand: bool = True) -> list[Job]:
    """One job per device of each group that has keys.

    With ``on_demand`` (the default) every device of a group gets the group's whole key
    list and takes keys by claim at run time; otherwise the keys are split round-robin
    (:func:`~kdispatch.tuning.sweep.shard`) and a device without keys gets no job.
    """
    jobs: list[Job] = []
    for gi, run in enumerate(runs):
        names = run.group.names
        if not run.targets:
            continue
        if on_demand:
            for name in names:
                jobs.append(Job(len(jobs), name, run.group.device.key, tuple(run.targets),
                                group=gi, shared=len(names) > 1))
            continue
        for name, part in zip(names, sweep.shard(run.targets, len(names))):
            if part:
                jobs.append(Job(len(jobs), name, run.group.device.key, tuple(part), group=gi))
    return jobs


def claimer(claims: Any, flag: int = CLAIMED, offset: int = 0) -> Callable[[int], bool]:
    """``claim(i)``: True for the first worker to ask for key ``i`` of a shared register.

    ``claims`` is a lock-guarded array of flags (``multiprocessing.Array("b", n)``); the
    register of one key list starts at ``offset`` in it (workers started before the keys
    were planned share one array sized ahead, one slice per device group). With
    ``flag=FED`` it asks whether to feed key ``i`` to the compile pool: False once any
    worker fed it or claimed it for timing (that worker describes it itself).
    """
    def claim(i: int) -> bool:
        with claims.get_lock():
            have = claims[offset + i]
            if have & (CLAIMED | flag):
                return False
            claims[offset + i] = have | flag
            return True
    return claim


def extra_specs(ops: Iterable[str]) -> bytes:
    """What a fresh worker process needs to know the ``ops`` registered at run time.

    Built-in ops and ops of ``kdispatch.ops`` entry points are found by the worker itself
    (after it chose the interpreter or compiled mode). Other ops are pickled when they can
    be (by reference to their class), else the module that registers them on import is
    named, and the worker imports it.
    """
    from kdispatch.registry import _builtin_modules, _entry_points

    found = set(_builtin_modules()) | set(_entry_points())
    payload: list[Any] = []
    for name in sorted(set(ops) - found):
        op = get_op(name)
        try:
            payload.append(("op", pickle.dumps(op)))
        except (pickle.PicklingError, TypeError, AttributeError):
            payload.append(("module", getattr(op, "defining_module", type(op).__module__)))
    return pickle.dumps(payload)


def load_extra(extra: bytes) -> None:
    """Register (or import the modules of) the ops :func:`extra_specs` shipped."""
    import importlib

    for kind, value in pickle.loads(extra):
        if kind == "op":
            register(pickle.loads(value), replace=True)
        else:
            importlib.import_module(value)


def run_shard(targets: Sequence[TuneTarget], device_name: str, db_url: str,
              options: dict[str, Any], extra: bytes,
              progress: Callable[[Progress], None] | None = None,
              claim: Callable[[int], bool] | None = None,
              pool: Any = None,
              first_to_feed: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Register the shipped specs, then :func:`~kdispatch.tuning.sweep.tune_shard`.

    The interpreter is chosen before the specs are unpickled, so a spec module that
    imports kernels gets them in the right mode. Used by processes and Ray tasks alike.
    """
    if device_name == "cpu":
        sweep.use_interpreter()
    load_extra(extra)
    return sweep.tune_shard(list(targets), device_name, db_url, progress=progress,
                            claim=claim, pool=pool, first_to_feed=first_to_feed, **options)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _worker(job: Job, db_url: str, options: dict[str, Any], extra: bytes, events: Any,
            claims: Any = None, replies: Any = None, pool_workers: int = 1,
            offset: int = 0, timeline: dict[str, Any] | None = None) -> None:
    """Process entry: tune one shard, forwarding progress and the outcome (``timeline``:
    when the worker started and was ready, added to its throughput figures)."""
    def progress(p: Progress) -> None:
        events.put(("progress", job.index, p))

    claim = claimer(claims, CLAIMED, offset) if claims is not None else None
    first = claimer(claims, FED, offset) if claims is not None else None
    pool = RemotePool(events, replies, job.index, pool_workers) if replies is not None \
        else None
    try:
        counts = run_shard(job.targets, job.device_name, db_url, options, extra, progress,
                           claim, pool, first)
        if timeline is not None and "throughput" in counts:
            counts["throughput"].update(timeline)
    except KeyboardInterrupt:
        events.put(("failed", job.index, "interrupted"))
        raise SystemExit(130) from None
    except BaseException as exc:  # noqa: BLE001 - reported to the parent by device
        traceback.print_exc()  # the full traceback, on the worker's (inherited) stderr
        events.put(("failed", job.index, _describe(exc)))
        raise SystemExit(1) from None
    events.put(("done", job.index, counts))


# -- running -----------------------------------------------------------------------------------
class _Board:
    """Aggregates worker progress events into one (done, total, description)."""

    def __init__(self, jobs: Sequence[Job], on_update: UpdateFn | None):
        self.jobs = jobs
        self.on_update = on_update
        self.latest: dict[int, Progress] = {}
        self.ended: set[int] = set()

    def progress(self, index: int, p: Progress) -> None:
        self.latest[index] = p
        self.emit()

    def end(self, index: int) -> None:
        self.ended.add(index)
        self.emit()

    def emit(self) -> None:
        if self.on_update is None:
            return
        done = sum(p.done for p in self.latest.values())
        known = len(self.latest) == len(self.jobs)
        total = None
        if known:  # jobs sharing a key list each plan all of it: count a group once
            per_group: dict[int, int] = {}
            for j in self.jobs:
                t = self.latest[j.index].total
                per_group[j.group] = max(per_group.get(j.group, 0), t) if j.shared \
                    else per_group.get(j.group, 0) + t
            total = sum(per_group.values())
        running = len(self.jobs) - len(self.ended)
        waiting = sum(p.phase == "compiling" for i, p in self.latest.items()
                      if i not in self.ended)
        desc = f"{len(self.jobs)} workers, {running} running" + (
            f", {waiting} waiting for compiles" if waiting else "")
        self.on_update(done, total, desc)


def run_local(jobs: Sequence[Job], db_url: str, *, budget_minutes: float | None = None,
              seed: int = 0, mark_misses: bool = False, on_update: UpdateFn | None = None,
              compile_settings: CompileSettings | None = None,
              on_compile: CompileFn | None = None, pool: Any = None,
              workers: Any = None) -> list[WorkerResult]:
    """Run each job in its own spawned process and wait for all of them.

    Parameters
    ----------
    jobs : sequence of Job
        From :func:`make_jobs`; one process per job.
    db_url : str
        The database every worker writes to (a SQLite file or a server URL).
    budget_minutes, seed, mark_misses
        Passed to every worker's sweep.
    on_update : callable, optional
        ``on_update(done, total, description)`` with the candidates done over all workers
        (``total`` is None until every worker has planned).
    compile_settings : CompileSettings, optional
        Compile ahead in one pool for the host (this process owns it; see the module).
    on_compile : callable, optional
        ``on_compile(stats)`` with the pool's :class:`PoolStats` as it runs and at the end.
    pool : CompilePool, optional
        The host's pool, opened by the caller; else ``compile_settings`` open one here.
    workers : WarmWorkers, optional
        Processes started before the keys were planned (:class:`~kdispatch.tuning.
        workers.WarmWorkers`): the jobs go to them instead of to new processes.

    Returns
    -------
    list of WorkerResult
        One per job, in job order; a worker that died without a word (killed, crashed)
        gets an error naming its exit code.
    """
    if not jobs:
        return []
    options = {"budget_minutes": budget_minutes, "seed": seed, "mark_misses": mark_misses,
               "compile_settings": compile_settings}
    interpreter = all(j.device_name == "cpu" for j in jobs)
    with nullcontext(pool) if pool is not None else open_pool(
            compile_settings, interpreter=interpreter, timing_processes=len(jobs)) as host:
        if workers is not None:
            results = workers.run(jobs, db_url, options, extra_specs(
                t.op for j in jobs for t in j.targets), on_update, host, on_compile)
        else:
            results = _run_processes(jobs, db_url, options, on_update, host, on_compile)
        if host is not None and on_compile is not None:
            on_compile(host.stats())
    return results


def _run_processes(jobs: Sequence[Job], db_url: str, options: dict[str, Any],
                   on_update: UpdateFn | None, pool: Any, on_compile: CompileFn | None,
                   ) -> list[WorkerResult]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    extra = extra_specs(t.op for j in jobs for t in j.targets)
    sizes = {j.group: len(j.targets) for j in jobs if j.shared}  # one register per group
    claims = {g: ctx.Array("b", n) for g, n in sizes.items()}
    replies = {j.index: ctx.Queue() for j in jobs} if pool is not None else {}
    size = pool.stats().workers if pool is not None else 1
    procs = [ctx.Process(target=_worker, args=(j, db_url, options, extra, events,
                                               claims.get(j.group) if j.shared else None,
                                               replies.get(j.index), size),
                         name=f"kdispatch-tune-{j.device_name}-{j.index}", daemon=False)
             for j in jobs]
    for p in procs:
        p.start()
    return supervise(jobs, procs, events, replies, on_update, pool, on_compile)


def supervise(jobs: Sequence[Job], procs: Sequence[Any], events: Any, replies: dict[int, Any],
              on_update: UpdateFn | None, pool: Any, on_compile: CompileFn | None,
              join: bool = True) -> list[WorkerResult]:
    """Relay the progress and compile requests of the started ``procs`` (one per job, in
    job order) until each reported or died, then say how each ended. Closes ``pool``
    (before the reply queues) and the event queue. ``join=False``: the caller joins the
    processes that reported later (their teardown overlaps its summary)."""
    results = {j.index: WorkerResult(j.index, j.device_name) for j in jobs}
    board = _Board(jobs, on_update)

    def silent() -> list[Any]:  # processes of workers that did not report yet
        return [p for j, p in zip(jobs, procs) if results[j.index].counts is None
                and results[j.index].error is None]

    def handle(event: tuple[Any, ...]) -> None:
        kind, index = event[0], event[1]
        if kind == "progress":
            board.progress(index, event[2])
        elif kind == "done":
            results[index].counts = event[2]
            board.end(index)
        elif kind == "failed":
            results[index].error = event[2]
            board.end(index)
        elif kind == "compile":
            pool.submit(event[2], on_done=lambda vid, o, q=replies[index]: q.put((vid, o)))
        elif kind == "prioritize":
            pool.prioritize(event[2])

    shown = 0.0
    try:
        while any(p.is_alive() for p in silent()):
            try:
                handle(events.get(timeout=0.1))
            except queue_mod.Empty:
                pass
            if on_compile is not None and pool is not None and time.monotonic() > shown:
                on_compile(pool.stats())
                shown = time.monotonic() + 0.5
        deadline = time.monotonic() + 5
        while silent() and time.monotonic() < deadline:  # what a dead one put last
            try:
                handle(events.get(timeout=0.2))
            except queue_mod.Empty:
                break
    except KeyboardInterrupt:
        for p in procs:  # the workers got the same SIGINT; give them time to record it
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        raise
    finally:
        for p in procs if join else silent():
            p.join()
        events.close()
        if pool is not None:
            pool.close()  # before its reply queues: it may still answer a worker that ended
        for q in replies.values():
            q.cancel_join_thread()  # answers nobody will read must not block the exit
            q.close()
    for job, p in zip(jobs, procs):
        r = results[job.index]
        if r.counts is None and r.error is None:
            r.error = f"worker exited with code {p.exitcode} before reporting"
        elif r.error is None and p.exitcode not in (0, None):
            r.error = f"worker exited with code {p.exitcode}"
    return [results[j.index] for j in jobs]
