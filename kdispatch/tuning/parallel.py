"""Tuning on several devices of one host: one worker process per device, one database.

``kdispatch tune --device all`` (or ``--device cuda:0,cuda:1``) groups the devices by their
dispatch device key, plans the keys of each group for that device, splits them across the
group's devices, and runs :func:`kdispatch.tuning.sweep.tune_shard` in one spawned process
per device, every worker writing to the same database URL. The worker processes start
first (:class:`~kdispatch.tuning.workers.WarmWorkers`): their imports and GPU set-up overlap
the planning, and they report their dispatch devices, so this process never touches a GPU. Keys are handed out on demand:
the workers of a group share the group's key list and a register of claimed keys, and each
takes the next unclaimed key when it is free, one it described ahead for the compile pool
first (:func:`~kdispatch.tuning.ahead.turns`; a fixed round-robin split left one of two
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
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from kdispatch.device import Device
from kdispatch.registry import get_op
from kdispatch.tuning import sweep
from kdispatch.tuning.ahead import CompileSettings
from kdispatch.tuning.devices import TuningError, is_multi_device, parse_devices
from kdispatch.tuning.estimate import SpaceRule
from kdispatch.tuning.jobs import (CompileFn, DeviceGroup, GroupRun, Job, UpdateFn,
                                   WorkerResult, claimer, extra_specs, make_jobs, run_local,
                                   run_shard)
from kdispatch.tuning.plan import TuneTarget, plan, plan_defaults, plan_misses
from kdispatch.tuning.workers import (Started, WarmWorkers, failure_message, start_devices,
                                      totals)

__all__ = ["DeviceGroup", "GroupRun", "Job", "Reporter", "UpdateFn", "WorkerResult",
           "claimer", "device_for", "extra_specs", "failure_message", "group_devices",
           "is_multi_device", "make_jobs", "parse_devices", "plan_targets", "run_local",
           "run_shard", "start_devices", "totals", "tune_devices", "tune_local"]


# -- devices -----------------------------------------------------------------------------------
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
                 max_input_bytes: int | None = None, space: SpaceRule | None = None,
                 ) -> tuple[list[TuneTarget], list[str]]:
    """The keys to tune on ``device``: the presets' keys (or, with ``ops`` and no preset,
    the ops' own default keys), plus recorded misses if asked.

    Returns
    -------
    targets : list of TuneTarget
        Deduplicated; each carries ``max_candidates`` when given, else the preset's cap
        unless ``space`` lifts it (:class:`~kdispatch.tuning.estimate.SpaceRule`).
    notes : list of str
        Entries skipped, as :func:`kdispatch.tuning.plan.plan` reports them, and the
        ``space`` rule's choice.
    """
    if presets:
        targets, notes = plan(device, presets, ops or None)
    elif ops and not from_misses:
        targets, notes = plan_defaults(device, ops)
    else:
        targets, notes = [], []
    if from_misses:
        more, miss_notes = plan_misses(store, device, ops or None,
                                       max_input_bytes=max_input_bytes)
        have = {(t.op, json.dumps(t.key, sort_keys=True)) for t in targets}
        targets += [t for t in more if (t.op, json.dumps(t.key, sort_keys=True)) not in have]
        notes += miss_notes
    # ops that ask to be timed first (small kernels), then the rest, each in plan order
    targets.sort(key=lambda t: not getattr(get_op(t.op).tuning, "time_first", False))
    if max_candidates is not None:
        targets = [dataclasses.replace(t, max_candidates=max_candidates) for t in targets]
    elif space is not None:
        targets, note = space.apply(targets, interpreter=device.is_interpreter)
        if note:
            notes = notes + [note]
    return targets, notes


def tune_local(runs: Sequence[GroupRun], store: Any, *, budget_minutes: float | None = None,
               seed: int = 0, mark_misses: bool = False, on_update: UpdateFn | None = None,
               compile_settings: CompileSettings | None = None,
               on_compile: CompileFn | None = None, pool: Any = None,
               workers: WarmWorkers | None = None) -> list[WorkerResult]:
    """Hand every group's keys to its devices, run the workers, then summarize.

    Each :class:`GroupRun` gets ``summaries`` read back from the database
    (:func:`~kdispatch.tuning.sweep.summarize` over all its keys), so the table is the one
    a single-device run prints, whatever worker measured which key. ``pool``: the host's
    compile pool when the caller opened it already (see :func:`run_local`); ``workers``:
    worker processes started before planning (:class:`~kdispatch.tuning.workers.WarmWorkers`).

    Returns
    -------
    list of WorkerResult
        Check :func:`failure_message`; summaries are filled in either way.
    """
    jobs = make_jobs(runs)
    results = run_local(jobs, store.url, budget_minutes=budget_minutes, seed=seed,
                        mark_misses=mark_misses, on_update=on_update,
                        compile_settings=compile_settings, on_compile=on_compile, pool=pool,
                        workers=workers)
    for run in runs:
        run.summaries = sweep.summarize(store, run.group.device, run.targets)
    return results


class Reporter(Protocol):
    """What the orchestrators show (the CLI implements it with rich)."""

    def announce(self, dev: Device, targets: list[TuneTarget], notes: list[str], store: Any,
                 from_misses: bool, where: str = "") -> bool:
        """Print the notes and the plan; False when there is nothing to tune."""

    def progress(self) -> AbstractContextManager[UpdateFn]:
        """A context yielding ``on_update(done, total, description)``."""

    def compiling(self, stats: Any) -> None:
        """Show the host compile pool's :class:`~kdispatch.tuning.compile_pool.PoolStats`."""


def tune_devices(device_spec: str, store: Any, plan: dict[str, Any], run: dict[str, Any],
                 ui: Reporter, started: Started | None = None,
                 ) -> tuple[list[GroupRun], list[WorkerResult]]:
    """``--device all`` / ``cuda:0,cuda:1`` / ``cpu,cpu``: plan per device group, run, summarize.

    Parameters
    ----------
    device_spec : str
        The ``--device`` value (see :func:`parse_devices`).
    store : Store
        The database every worker writes to.
    plan : dict
        Keyword arguments of :func:`plan_targets` (``presets``, ``ops``, ``from_misses``,
        ``max_candidates``, ``space``: its ``gpus`` and ``compile_workers`` are set here for
        each device group).
    run : dict
        ``budget_minutes``, ``seed``, ``mark_misses`` and ``compile_settings`` for every
        worker.
    ui : Reporter
        Shows the plan and the aggregated progress.
    started : Started, optional
        The worker processes and the compile pool, started by the caller for
        ``device_spec`` and ``run``'s compile settings (:func:`~kdispatch.tuning.workers.
        start_devices`, before its imports); else they are started here.

    Returns
    -------
    runs : list of GroupRun
        One per device group with keys, with its summaries.
    results : list of WorkerResult
        One per worker; see :func:`failure_message`.
    """
    settings = run.get("compile_settings")
    if started is None:
        with start_devices(device_spec, settings) as started:
            return tune_devices(device_spec, store, plan, run, ui, started)
    return _plan_and_run(started.names, store, plan, run, ui, settings, started.pool,
                         started.warm)


def _plan_and_run(names: list[str], store: Any, plan: dict[str, Any], run: dict[str, Any],
                  ui: Reporter, settings: CompileSettings | None, pool: Any,
                  warm: WarmWorkers) -> tuple[list[GroupRun], list[WorkerResult]]:
    ready = warm.devices()  # the workers set up their GPUs; this process touches none
    groups = group_devices([(n, dev) for n, dev, _ in ready])
    budgets: dict[str, int] = {}
    for n, _, b in ready:
        budgets[n] = min(budgets.get(n, b), b)
    runs = []
    for g in groups:
        kw = dict(plan)
        if kw.get("space") is not None:
            workers = settings.workers_for(len(names), g.device.is_interpreter) \
                if settings is not None else 0
            kw["space"] = dataclasses.replace(kw["space"], gpus=len(g.names),
                                              compile_workers=workers)
        budget = min(budgets[n] for n in g.names)
        targets, notes = plan_targets(store, g.device, **kw, max_input_bytes=budget)
        where = f"; {len(g.names)} workers: {', '.join(g.names)}"
        if ui.announce(g.device, targets, notes, store, plan.get("from_misses", False), where):
            runs.append(GroupRun(g, targets, notes))
    if not runs:
        return [], []
    with ui.progress() as on_update:
        results = tune_local(runs, store, on_update=on_update, on_compile=ui.compiling,
                             pool=pool, workers=warm, **run)
    return runs, results
