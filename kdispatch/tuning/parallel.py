"""Tuning on several devices of one host: one worker process per device, one database.

``kdispatch tune --device all`` (or ``--device cuda:0,cuda:1``) groups the devices by their
dispatch device key, plans the keys of each group for that device, splits them across the
group's devices, and runs :func:`kdispatch.tuning.sweep.tune_shard` in one spawned process
per device, every worker writing to the same database URL. Keys are handed out on demand:
the workers of a group share the group's key list and a register of claimed keys, and each
takes the next unclaimed key when it is free (a fixed round-robin split left one of two
H200s idle for a third of a run while the other tuned the costly keys; docs/benchmarks.md).
Devices with the same key (identical GPUs) tune one table
together; devices with different keys never share a key, so their rows never mix.

``--device cpu,cpu`` runs two Triton-interpreter workers: the interpreter key is shared, so
the keys are sharded across the two processes (this is how the path is tested without a GPU).

Ops registered at run time (``kdispatch.registry.register``, e.g. plugins or test fakes) are
not known to a fresh worker process: their spec objects are pickled (by reference to their
class, so the defining module must be importable in the worker) and registered there.

A failing worker does not stop the others; :func:`run_local` returns one
:class:`WorkerResult` per worker and :func:`failure_message` names the failed devices.
Measurements are committed one by one, so whatever a failed worker measured stays.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import queue as queue_mod
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from kdispatch.device import Device
from kdispatch.registry import get_op, register
from kdispatch.tuning import sweep
from kdispatch.tuning.sweep import KeySummary, Progress, TuneTarget, TuningError

#: ``on_update(done, total, description)``: the aggregated progress of all workers
UpdateFn = Callable[[int, "int | None", str], None]


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


# -- devices -----------------------------------------------------------------------------------
def is_multi_device(spec: str) -> bool:
    """Whether ``--device`` names several devices (``all`` or a comma-separated list)."""
    return spec.strip().lower() == "all" or "," in spec


def parse_devices(spec: str) -> list[str]:
    """Worker device names for ``--device all`` / ``cuda:0,cuda:1`` / ``cpu,cpu``.

    Parameters
    ----------
    spec : str
        ``"all"`` (every CUDA/HIP device of this host) or a comma-separated list of
        ``cuda:N`` (each at most once) or of ``cpu`` (any number of interpreter workers).

    Returns
    -------
    list of str
        Normalized names, ``"cuda:N"`` or ``"cpu"``.

    Raises
    ------
    TuningError
        No GPU for ``all``, an unknown or repeated GPU, or CPU and GPU mixed.
    """
    spec = spec.strip().lower()
    if spec == "all":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise TuningError("--device all: no CUDA/HIP GPU is available here; use "
                              "--device cpu,cpu to exercise the multi-process path")
        return [f"cuda:{i}" for i in range(count)]
    names = []
    for raw in (p.strip() for p in spec.split(",")):
        if not raw:
            continue
        if raw in ("cpu", "interpreter", "cpu-interpreter"):
            names.append("cpu")
        elif raw.startswith("cuda:") and raw[5:].isdigit():
            names.append(f"cuda:{int(raw[5:])}")
        else:
            raise TuningError(f"device {raw!r}: expected cpu or cuda:N in a device list")
    if not names:
        raise TuningError(f"--device {spec!r}: no devices named")
    if "cpu" in names and len(set(names)) > 1:
        raise TuningError("--device: do not mix cpu (the Triton interpreter) and GPUs in one "
                          "run; tune them separately")
    gpus = [n for n in names if n != "cpu"]
    if len(set(gpus)) != len(gpus):
        raise TuningError("--device: a GPU is listed twice; two tuners on one GPU would "
                          "disturb each other's timings")
    return names


def device_for(name: str) -> Device:
    """The dispatch device of a worker name, without selecting it in this process.

    Raises
    ------
    TuningError
        The GPU does not exist, or the Triton interpreter mode is wrong for it.
    """
    if name == "cpu":
        sweep.use_interpreter()
        return Device.interpreter()
    import torch

    index = int(name.split(":", 1)[1])
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not 0 <= index < count:
        raise TuningError(f"device {name!r}: this host has {count} GPUs")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise TuningError("TRITON_INTERPRET=1 is set: GPU tuning needs compiled kernels")
    return Device.from_torch(torch.device("cuda", index))


def group_devices(named: Sequence[tuple[str, Device]]) -> list[DeviceGroup]:
    """Group worker devices by dispatch device, in first-seen order.

    Devices group together only when every device field of a key agrees (family key,
    vendor, arch, CU count), so shards of one group write rows of one device key.

    >>> d = Device.interpreter()
    >>> [g.names for g in group_devices([("cpu", d), ("cpu", d)])]
    [('cpu', 'cpu')]
    """
    groups: dict[tuple[str, str, str, int], tuple[Device, list[str]]] = {}
    for name, dev in named:
        k = (dev.key, dev.vendor, dev.arch, dev.cu_count)
        groups.setdefault(k, (dev, []))[1].append(name)
    return [DeviceGroup(dev, tuple(names)) for dev, names in groups.values()]


# -- planning ----------------------------------------------------------------------------------
def plan_targets(store: Any, device: Device, presets: Sequence[str], ops: Sequence[str] | None,
                 *, from_misses: bool = False, max_candidates: int | None = None,
                 ) -> tuple[list[TuneTarget], list[str]]:
    """The keys to tune on ``device``: the presets' keys, plus recorded misses if asked.

    Returns
    -------
    targets : list of TuneTarget
        Deduplicated; each carries ``max_candidates`` when given.
    notes : list of str
        Entries skipped, as :func:`kdispatch.tuning.sweep.plan` reports them.
    """
    targets, notes = sweep.plan(device, presets, ops or None) if presets else ([], [])
    if from_misses:
        more, miss_notes = sweep.plan_misses(store, device, ops or None)
        have = {(t.op, json.dumps(t.key, sort_keys=True)) for t in targets}
        targets += [t for t in more if (t.op, json.dumps(t.key, sort_keys=True)) not in have]
        notes += miss_notes
    if max_candidates is not None:
        targets = [dataclasses.replace(t, max_candidates=max_candidates) for t in targets]
    return targets, notes


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


def claimer(claims: Any) -> Callable[[int], bool]:
    """``claim(i)``: True for the first worker to ask for key ``i`` of a shared register.

    ``claims`` is a lock-guarded array of flags (``multiprocessing.Array("b", n)``).
    """
    def claim(i: int) -> bool:
        with claims.get_lock():
            if claims[i]:
                return False
            claims[i] = 1
            return True
    return claim


def extra_specs(ops: Iterable[str]) -> bytes:
    """Pickled specs of the ``ops`` a fresh process would not know (registered at run time).

    Built-in ops (defined inside ``kdispatch``) are not shipped: workers import them
    themselves, after choosing the interpreter or compiled mode.
    """
    specs = []
    for op in sorted(set(ops)):
        spec = get_op(op)
        if not type(spec).__module__.startswith("kdispatch."):
            specs.append(spec)
    return pickle.dumps(specs)


def run_shard(targets: Sequence[TuneTarget], device_name: str, db_url: str,
              options: dict[str, Any], extra: bytes,
              progress: Callable[[Progress], None] | None = None,
              claim: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Register the shipped specs, then :func:`~kdispatch.tuning.sweep.tune_shard`.

    The interpreter is chosen before the specs are unpickled, so a spec module that
    imports kernels gets them in the right mode. Used by processes and Ray tasks alike.
    """
    if device_name == "cpu":
        sweep.use_interpreter()
    for spec in pickle.loads(extra):
        register(spec, replace=True)
    return sweep.tune_shard(list(targets), device_name, db_url, progress=progress,
                            claim=claim, **options)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _worker(job: Job, db_url: str, options: dict[str, Any], extra: bytes, events: Any,
            claims: Any = None) -> None:
    """Process entry (spawn): tune one shard, forwarding progress and the outcome."""
    def progress(p: Progress) -> None:
        events.put(("progress", job.index, p))

    claim = claimer(claims) if claims is not None else None
    try:
        counts = run_shard(job.targets, job.device_name, db_url, options, extra, progress,
                           claim)
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
        desc = f"{len(self.jobs)} workers, {running} running"
        self.on_update(done, total, desc)


def run_local(jobs: Sequence[Job], db_url: str, *, budget_minutes: float | None = None,
              seed: int = 0, mark_misses: bool = False, on_update: UpdateFn | None = None,
              ) -> list[WorkerResult]:
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

    Returns
    -------
    list of WorkerResult
        One per job, in job order; a worker that died without a word (killed, crashed)
        gets an error naming its exit code.
    """
    import multiprocessing as mp

    if not jobs:
        return []
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    options = {"budget_minutes": budget_minutes, "seed": seed, "mark_misses": mark_misses}
    extra = extra_specs(t.op for j in jobs for t in j.targets)
    results = {j.index: WorkerResult(j.index, j.device_name) for j in jobs}
    board = _Board(jobs, on_update)
    sizes = {j.group: len(j.targets) for j in jobs if j.shared}  # one register per group
    claims = {g: ctx.Array("b", n) for g, n in sizes.items()}
    procs = [ctx.Process(target=_worker, args=(j, db_url, options, extra, events,
                                               claims.get(j.group) if j.shared else None),
                         name=f"kdispatch-tune-{j.device_name}-{j.index}", daemon=False)
             for j in jobs]

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

    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            try:
                handle(events.get(timeout=0.1))
            except queue_mod.Empty:
                pass
        # every worker has exited, so everything it put is in the pipe: drain it
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
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
        for p in procs:
            p.join()
        events.close()
    for job, p in zip(jobs, procs):
        r = results[job.index]
        if r.counts is None and r.error is None:
            r.error = f"worker exited with code {p.exitcode} before reporting"
        elif r.error is None and p.exitcode not in (0, None):
            r.error = f"worker exited with code {p.exitcode}"
    return [results[j.index] for j in jobs]


def failure_message(results: Sequence[WorkerResult]) -> str | None:
    """One line naming each failed worker's device and error, or None if all succeeded."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return None
    parts = [f"worker {r.index} on {r.device_name} failed: {r.error}" for r in failed]
    return (f"{len(failed)} of {len(results)} tuning workers failed ("
            + "; ".join(parts) + "); measurements they committed are kept, rerun to resume")


def tune_local(runs: Sequence[GroupRun], store: Any, *, budget_minutes: float | None = None,
               seed: int = 0, mark_misses: bool = False, on_update: UpdateFn | None = None,
               ) -> list[WorkerResult]:
    """Hand every group's keys to its devices, run the workers, then summarize.

    Each :class:`GroupRun` gets ``summaries`` read back from the database
    (:func:`~kdispatch.tuning.sweep.summarize` over all its keys), so the table is the one
    a single-device run prints, whatever worker measured which key.

    Returns
    -------
    list of WorkerResult
        Check :func:`failure_message`; summaries are filled in either way.
    """
    jobs = make_jobs(runs)
    results = run_local(jobs, store.url, budget_minutes=budget_minutes, seed=seed,
                        mark_misses=mark_misses, on_update=on_update)
    for run in runs:
        run.summaries = sweep.summarize(store, run.group.device, run.targets)
    return results


def totals(results: Sequence[WorkerResult]) -> tuple[int, int, bool]:
    """(measured, skipped, whether any worker stopped on its budget) over the workers."""
    measured = sum((r.counts or {}).get("measured", 0) for r in results)
    skipped = sum((r.counts or {}).get("skipped", 0) for r in results)
    stopped = any((r.counts or {}).get("stopped") == "budget" for r in results)
    return measured, skipped, stopped


class Reporter(Protocol):
    """What the orchestrators show (the CLI implements it with rich)."""

    def announce(self, dev: Device, targets: list[TuneTarget], notes: list[str], store: Any,
                 from_misses: bool, where: str = "") -> bool:
        """Print the notes and the plan; False when there is nothing to tune."""

    def progress(self) -> AbstractContextManager[UpdateFn]:
        """A context yielding ``on_update(done, total, description)``."""


def tune_devices(device_spec: str, store: Any, plan: dict[str, Any], run: dict[str, Any],
                 ui: Reporter) -> tuple[list[GroupRun], list[WorkerResult]]:
    """``--device all`` / ``cuda:0,cuda:1`` / ``cpu,cpu``: plan per device group, run, summarize.

    Parameters
    ----------
    device_spec : str
        The ``--device`` value (see :func:`parse_devices`).
    store : Store
        The database every worker writes to.
    plan : dict
        Keyword arguments of :func:`plan_targets` (``presets``, ``ops``, ``from_misses``,
        ``max_candidates``).
    run : dict
        ``budget_minutes``, ``seed`` and ``mark_misses`` for every worker.
    ui : Reporter
        Shows the plan and the aggregated progress.

    Returns
    -------
    runs : list of GroupRun
        One per device group with keys, with its summaries.
    results : list of WorkerResult
        One per worker; see :func:`failure_message`.
    """
    names = parse_devices(device_spec)
    groups = group_devices([(n, device_for(n)) for n in names])
    runs = []
    for g in groups:
        targets, notes = plan_targets(store, g.device, **plan)
        where = f"; {len(g.names)} workers: {', '.join(g.names)}"
        if ui.announce(g.device, targets, notes, store, plan.get("from_misses", False), where):
            runs.append(GroupRun(g, targets, notes))
    if not runs:
        return [], []
    with ui.progress() as on_update:
        results = tune_local(runs, store, on_update=on_update, **run)
    return runs, results
