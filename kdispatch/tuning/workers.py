"""Tuning worker processes started before the keys are planned (``--device all``).

A worker's start-up (a spawned interpreter importing torch, Triton and the ops, then
setting up its GPU) took seconds that nothing else overlapped when the workers were
started after the keys were planned: on an H200 host it cost as much as the parent's own
start-up, so two GPUs spent a third of a run starting. :class:`WarmWorkers` starts one
process per device first; each sets up its device and reports the dispatch device it
tunes for (and how much input memory a key may take there), so the parent plans the keys
without touching a GPU itself, while the workers start; then each worker gets its job
(:class:`~kdispatch.tuning.jobs.Job`) and runs it as a freshly spawned worker would
(:func:`kdispatch.tuning.jobs.supervise` relays its progress and compile requests).

Workers of one device group share a claim register (:func:`~kdispatch.tuning.jobs.claimer`);
the registers of all groups are slices of one lock-guarded array made before the keys are
known (a shared array can only be handed to a process when it is spawned), sized for
:data:`CLAIM_CAPACITY` keys. Nothing here names an op.
"""

from __future__ import annotations

import os
import queue as queue_mod
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from kdispatch.device import Device
from kdispatch.tuning.devices import TuningError, parse_devices, use_interpreter
from kdispatch.tuning.pool_settings import CompileSettings, open_pool
from kdispatch.tuning.throughput import process_age

if TYPE_CHECKING:  # the tuner itself (torch, the database) is imported where it runs
    from kdispatch.tuning.jobs import CompileFn, Job, UpdateFn, WorkerResult

#: keys all device groups of one run may have together (one byte of shared memory each)
CLAIM_CAPACITY = 1 << 20
#: how often a worker waiting for its job checks that its parent is still there
POLL_S = 0.5


def _warm_worker(index: int, name: str, events: Any, inbox: Any, claims: Any, replies: Any,
                 pool_workers: int, base: float) -> None:
    """Process entry (spawn): set up the device, report it, then run the job that comes.

    ``base`` is the run's start on the ``time.monotonic`` clock (system-wide), so the
    worker's start-up shows in the parent's summary. A worker that reported its result
    exits without the interpreter's teardown (torch's, the CUDA context's: about a second
    the parent's exit would wait for)."""
    from kdispatch.tuning.devices import input_budget, resolve_device
    from kdispatch.tuning.jobs import _describe, _worker

    started = time.monotonic() - base - (process_age() or 0.0)
    parent = os.getppid()
    try:
        if name == "cpu":
            use_interpreter()
        dev, tdev = resolve_device(name)
        budget = input_budget(tdev)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BaseException as exc:  # noqa: BLE001 - reported to the parent by device
        text = str(exc).strip().splitlines()
        events.put(("failed", index, text[0] if isinstance(exc, TuningError) and text
                    else _describe(exc)))
        raise SystemExit(1) from None
    ready = time.monotonic() - base
    events.put(("ready", index, dev, budget, started, ready))
    try:
        while True:
            try:
                msg = inbox.get(timeout=POLL_S)
                break
            except queue_mod.Empty:
                if os.getppid() != parent:
                    return  # the parent is gone: nothing will come
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    if msg is None:
        return
    job, db_url, options, extra, offset = msg
    timeline: dict[str, Any] = {"device": name, "worker_start_s": started, "ready_s": ready,
                "start_s": time.monotonic() - base}
    _worker(job, db_url, options, extra, events, claims if job.shared else None, replies,
            pool_workers, offset, timeline)
    _exit_now(events)


def _exit_now(events: Any) -> None:
    """Exit at once, once what this process put on ``events`` is in the pipe (everything
    it measured is committed, its store disposed)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    events.close()
    events.join_thread()
    os._exit(0)


class WarmWorkers:
    """One tuning process per device name, started now (see the module docstring).

    Parameters
    ----------
    names : sequence of str
        Worker device names (``"cuda:0"``, ``"cpu"``), from
        :func:`~kdispatch.tuning.parallel.parse_devices`.
    pool_workers : int
        Processes of the host's compile pool (0: none; the workers then get no reply
        queues and compile at launch or in a pool of their own).
    """

    def __init__(self, names: Sequence[str], pool_workers: int = 0):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.names = list(names)
        #: the run's start on the monotonic clock (this process's start where known)
        self.base = time.monotonic() - (process_age() or 0.0)
        self.events = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in self.names]
        self._claims = ctx.Array("b", CLAIM_CAPACITY)
        self.replies = {i: ctx.Queue() for i in range(len(self.names))} if pool_workers \
            else {}
        self.procs = [ctx.Process(target=_warm_worker, args=(
            i, name, self.events, self._inboxes[i], self._claims, self.replies.get(i),
            max(1, pool_workers), self.base), name=f"kdispatch-tune-{name}-{i}", daemon=False)
            for i, name in enumerate(self.names)]
        for p in self.procs:
            p.start()
        self._ready: dict[int, tuple[Device, int]] = {}
        self._sent: set[int] = set()

    def devices(self) -> list[tuple[str, Device, int]]:
        """``(name, dispatch device, input budget in bytes)`` of every worker, once all
        have set up their devices.

        Raises
        ------
        TuningError
            A worker could not set up its device (the first such error, one line).
        """
        while len(self._ready) < len(self.names):
            try:
                event = self.events.get(timeout=0.2)
            except queue_mod.Empty:
                for i, p in enumerate(self.procs):
                    if i not in self._ready and not p.is_alive():
                        raise TuningError(f"the tuning process for {self.names[i]} exited "
                                          f"with code {p.exitcode} while it set up its "
                                          "device") from None
                continue
            if event[0] == "failed":
                raise TuningError(event[2])
            if event[0] == "ready":
                self._ready[event[1]] = (event[2], event[3])
        return [(n, *self._ready[i]) for i, n in enumerate(self.names)]

    def assign(self, jobs: Sequence[Job]) -> list[Job]:
        """``jobs`` (from :func:`~kdispatch.tuning.jobs.make_jobs`) with each ``index`` set
        to the worker of its device name that takes it."""
        from kdispatch.tuning.jobs import Job

        free = list(range(len(self.names)))
        out = []
        for job in jobs:
            i = next((i for i in free if self.names[i] == job.device_name), None)
            if i is None:
                raise TuningError(f"no worker left for a job on {job.device_name}")
            free.remove(i)
            out.append(Job(i, job.device_name, job.device_key, job.targets, job.group,
                           job.shared))
        return out

    def run(self, jobs: Sequence[Job], db_url: str, options: dict[str, Any], extra: bytes,
            on_update: UpdateFn | None, pool: Any, on_compile: CompileFn | None,
            ) -> list[WorkerResult]:
        """Hand each job to its worker (workers without one exit) and wait for them, as
        :func:`~kdispatch.tuning.jobs.run_local` does for processes it starts; the
        processes of workers that reported are joined by :meth:`close`."""
        from kdispatch.tuning.jobs import supervise

        jobs = self.assign(jobs)
        offsets: dict[int, int] = {}
        used = 0
        for j in jobs:
            if j.shared and j.group not in offsets:
                offsets[j.group] = used
                used += len(j.targets)
        if used > CLAIM_CAPACITY:
            raise TuningError(f"{used} keys: a run shares at most {CLAIM_CAPACITY} keys "
                              "between devices; tune fewer at a time")
        for j in jobs:
            self._inboxes[j.index].put((j, db_url, options, extra, offsets.get(j.group, 0)))
            self._sent.add(j.index)
        for i, box in enumerate(self._inboxes):
            if i not in self._sent:
                box.put(None)
                self._sent.add(i)
        procs = [self.procs[j.index] for j in jobs]
        replies = {j.index: self.replies[j.index] for j in jobs if j.index in self.replies}
        return supervise(jobs, procs, self.events, replies, on_update, pool, on_compile,
                         join=False)

    def close(self) -> None:
        """Tell workers that got no job to exit, then wait for every process."""
        for i, box in enumerate(self._inboxes):
            if i not in self._sent:
                try:
                    box.put(None)
                except (OSError, ValueError):
                    pass
                self._sent.add(i)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for q in [*self._inboxes, *self.replies.values()]:
            q.cancel_join_thread()
            q.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def failure_message(results: Sequence[WorkerResult]) -> str | None:
    """One line naming each failed worker's device and error, or None if all succeeded."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return None
    parts = [f"worker {r.index} on {r.device_name} failed: {r.error}" for r in failed]
    return (f"{len(failed)} of {len(results)} tuning workers failed ("
            + "; ".join(parts) + "); measurements they committed are kept, rerun to resume")


def totals(results: Sequence[WorkerResult]) -> tuple[int, int, bool]:
    """(measured, skipped, whether any worker stopped on its budget) over the workers."""
    measured = sum((r.counts or {}).get("measured", 0) for r in results)
    skipped = sum((r.counts or {}).get("skipped", 0) for r in results)
    stopped = any((r.counts or {}).get("stopped") == "budget" for r in results)
    return measured, skipped, stopped


@dataclass(frozen=True)
class Started:
    """What :func:`start_devices` started: the worker names, their processes, the pool."""

    names: list[str]
    warm: WarmWorkers
    pool: Any


@contextmanager
def start_devices(device_spec: str, settings: CompileSettings | None) -> Iterator[Started]:
    """Start one worker process per device of ``device_spec`` (``all``, ``cuda:0,cuda:1``,
    ``cpu,cpu``), then the host's compile pool for ``settings``; both are closed on exit.

    Light on imports (no torch for a device list), so a caller starts them before it imports
    the tuner and their start-up overlaps its own.
    """
    names = parse_devices(device_spec)
    interpreter = all(n == "cpu" for n in names)
    if interpreter:
        use_interpreter()  # this process plans the keys of the interpreter device
    size = settings.workers_for(len(names), interpreter) if settings is not None else 0
    # the workers first (importing torch and setting up a GPU takes them seconds)
    with WarmWorkers(names, size) as warm, open_pool(
            settings, interpreter=interpreter, timing_processes=len(names)) as pool:
        yield Started(names, warm, pool)
