"""The sweep driver: tune a list of op keys on one device into the database.

For each key: enumerate the op's candidates, prune them with ``is_valid``, always add the
heuristic's config (and the baseline), skip configs already measured for this key, source
hash and toolchain (resume), then verify every remaining candidate against the fp32
reference on random inputs and time the ones that pass (:mod:`kdispatch.tuning.measure`:
the inputs and the reference are made once per key; a candidate whose pilot is clearly
slower than the key's best full measurement is not timed further). Every measurement is
committed as it completes, so a killed tuner loses at most the candidate in flight and the
key's first fully timed row, which waits for the key's end to be timed a second time
(:func:`~kdispatch.tuning.measure.retime_first`).

The work is a plain list of :class:`~kdispatch.tuning.plan.TuneTarget` (op name + key as
JSON data), so it can be split and run by worker processes (:func:`tune_shard`), each with
its own device, all writing to one database; :func:`summarize` reads the result back from
the database, so one summary covers every shard. Nothing here names an op.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdispatch.device import Device
from kdispatch.opdef import OpConfig
from kdispatch.registry import get_op
from kdispatch.store import MeasurementIn, Store, digest
from kdispatch.tuning.ahead import (CompileAhead, CompileSettings, Pool, open_pool,
                                    rejected_row, turns)
from kdispatch.tuning.devices import (TuningError, check_kernel_mode, resolve_device,
                                      use_interpreter)
from kdispatch.tuning.inputs import KeyInputs
from kdispatch.tuning.measure import KeyBest, measure, retime_first
from kdispatch.tuning.plan import (Role, TuneTarget, candidate_list, plan, plan_misses, shard,
                                   tunable_ops)
from kdispatch.tuning.precompile import CompileCounts, Target
from kdispatch.tuning.throughput import Throughput

__all__ = ["KeySummary", "Progress", "SweepResult", "TuneTarget", "TuningError",
           "candidate_list", "check_kernel_mode", "plan", "plan_misses", "resolve_device",
           "shard", "summarize", "tunable_ops", "tune", "tune_shard", "use_interpreter"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Progress:
    """What the progress callback receives after each candidate (and at each key start)."""

    op: str
    key: dict[str, Any]
    key_index: int
    key_count: int
    done: int
    total: int
    elapsed_s: float
    eta_s: float | None
    last: str = ""
    #: "timing", or "compiling" while the candidate's kernels are still in the compile pool
    phase: str = "timing"


@dataclass(frozen=True)
class KeySummary:
    """Per-key result, read back from the database (so it covers resumed and other runs)."""

    op: str
    key: dict[str, Any]
    best_config: dict[str, Any] | None
    best_us: float | None
    heuristic_config: dict[str, Any]
    heuristic_us: float | None
    ok: int
    rejected: int
    infeasible: int

    @property
    def speedup(self) -> float | None:
        """Heuristic time over best time (>= 1 when the sweep found something faster)."""
        if self.best_us and self.heuristic_us:
            return self.heuristic_us / self.best_us
        return None


@dataclass
class SweepResult:
    """What :func:`tune` did."""

    device: Device
    run_id: int | None
    summaries: list[KeySummary]
    measured: int = 0
    skipped: int = 0
    stopped: str | None = None  # "budget" when the budget ran out
    notes: list[str] = field(default_factory=list)
    keys: int = 0  # keys this call took (all of them, unless ``claim`` gave some elsewhere)
    throughput: Throughput = field(default_factory=Throughput)


# -- tuning ------------------------------------------------------------------------------------
def _config_digest(cfg: OpConfig) -> str:
    return digest(cfg.model_dump(mode="json"))


def tune(targets: Sequence[TuneTarget], *, device: Device, torch_device: Any, store: Store,
         budget_minutes: float | None = None,
         progress: Callable[[Progress], None] | None = None, seed: int = 0,
         mark_misses: bool = False, reps: int | None = None,
         claim: Callable[[int], bool] | None = None, precompile: Pool | None = None,
         target: Target | None = None,
         first_to_feed: Callable[[int], bool] | None = None,
         summary: bool = True) -> SweepResult:
    """Tune ``targets`` on one device, committing each measurement as it completes.

    Parameters
    ----------
    targets : sequence of TuneTarget
        Keys to tune (from :func:`plan`, :func:`plan_misses` or a :func:`shard`).
    device : Device
        The dispatch device the keys were built for (``resolve_device(name)[0]``).
    torch_device : torch.device
        Where inputs live and kernels run (``resolve_device(name)[1]``).
    store : Store
        The database; measurements already there for the same source hash and toolchain
        are not measured again.
    budget_minutes : float, optional
        Stop cleanly (before the next candidate) once this much time has passed.
    progress : callable, optional
        Called with a :class:`Progress` at each key start and after each candidate.
    seed : int
        Seed of the random inputs.
    mark_misses : bool
        Mark each fully tuned key's recorded miss as tuned (``--from-misses``).
    reps : int, optional
        Timed samples per candidate (default: see :func:`time_call`).
    claim : callable, optional
        ``claim(i)`` is asked before key ``i`` of ``targets`` starts; False means another
        worker took it, and it is skipped. Workers sharing one claim register and one target
        list take keys on demand, so a worker that drew cheap keys takes more of them; a
        worker asks first for the keys it described ahead itself (:func:`~kdispatch.tuning.
        ahead.turns`).
    precompile, target : Pool, tuple, optional
        A compile pool and what it compiles for (default: this GPU; the interpreter has
        nothing to compile): every candidate's kernels are compiled ahead in it, key by key
        in timing order while earlier keys are timed, and a compiler rejection is
        infeasible without a launch (:mod:`kdispatch.tuning.ahead`).
    first_to_feed : callable, optional
        ``first_to_feed(i)`` is asked before this worker describes key ``i`` ahead for a
        pool it shares with other workers; False means another worker fed it already.
    summary : bool
        Read the per-key summaries back at the end (a worker of several skips it: its
        caller summarizes all keys once every worker is done).

    Returns
    -------
    SweepResult
        Counts, whether the budget stopped it, and the per-key summaries.

    Examples
    --------
    >>> dev, tdev = resolve_device("cpu")                       # doctest: +SKIP
    >>> targets, _ = plan(dev, ["smoke"])                       # doctest: +SKIP
    >>> tune(targets, device=dev, torch_device=tdev, store=Store()).summaries  # doctest: +SKIP
    """
    t0 = time.monotonic()
    deadline = t0 + budget_minutes * 60 if budget_minutes is not None else None
    specs = {t.op: get_op(t.op) for t in targets}
    for op in specs.values():
        if op.tuning is None:
            raise TuningError(f"op {op.name!r} has no tuning face")
    for spec in specs.values():
        check_kernel_mode(spec, device.is_interpreter)
    hashes = {op: spec.source_hash() for op, spec in specs.items()}

    work = []  # (target, spec, key, [(cfg, role)] to measure, candidates measured before)
    total = 0
    for t in targets:
        spec = specs[t.op]
        key = spec.parse_key(t.key)
        if key.device != device.key:
            raise TuningError(f"{t.op} key is for device {key.device!r}, tuning {device.key!r}")
        cands = candidate_list(spec, key, t.max_candidates)
        have = store.measured_configs(t.op, t.key, hashes[t.op])
        todo = [(c, h) for c, h in cands if _config_digest(c) not in have]
        total += len(todo)
        work.append((t, spec, key, todo, len(cands) - len(todo)))

    ahead = CompileAhead.for_run(precompile, target, device.is_interpreter, torch_device, seed)
    result = SweepResult(device=device, run_id=None, summaries=[])
    result.run_id = store.start_run(device, hashes)
    thr = result.throughput
    done = measured_here = 0
    measure_s = 0.0
    status = "failed"
    jit = CompileCounts().start()
    try:
        # keys are described for the pool as the timing goes (kdispatch.tuning.ahead)
        ahead.plan(((ki, w[1], w[2], [(_config_digest(c), c) for c, _ in w[3]])
                    for ki, w in enumerate(work)), first=first_to_feed)
        for ki in turns(len(work), claim, ahead):
            t, spec, key, todo, measured_before = work[ki]
            result.keys += 1
            result.skipped += measured_before

            def report(last: str = "", phase: str = "timing") -> None:
                if progress is None:
                    return
                eta = measure_s / measured_here * (total - done) if measured_here else None
                progress(Progress(t.op, t.key, ki, len(work), done, total,
                                  time.monotonic() - t0, eta, last, phase))

            def record(m: MeasurementIn) -> None:
                s0 = time.monotonic()
                if store.record(m, result.run_id):
                    result.measured += 1
                else:
                    result.skipped += 1
                thr.store_s += time.monotonic() - s0

            report()
            if todo:  # one query per key: what another tuner measured since the plan
                s0 = time.monotonic()
                have = store.measured_configs(t.op, t.key, hashes[t.op])
                thr.store_s += time.monotonic() - s0
                elsewhere = sum(_config_digest(c) in have for c, _ in todo)
                if elsewhere:
                    todo = [(c, r) for c, r in todo if _config_digest(c) not in have]
                    result.skipped += elsewhere
                    done += elsewhere
                    report("measured elsewhere")
            inputs: KeyInputs | None = None  # made before the first candidate waits, or runs
            if todo and (deadline is None or time.monotonic() < deadline):
                ahead.own(ki)  # its candidates wait for their own kernels from here on
                if ahead.active:  # the reference is computed while its kernels compile
                    c0 = time.monotonic()
                    inputs = KeyInputs(spec, key, torch_device, seed,
                                       made=ahead.take_inputs(ki))
                    thr.gpu_s += time.monotonic() - c0
            complete = True
            best = KeyBest()
            # the key's first fully timed row waits for the key's end: timed again after
            # its twins, the faster kept (retime_first)
            held: tuple[Any, Role, MeasurementIn] | None = None
            timed_after = 0
            for cfg, role in todo:
                if deadline is not None and time.monotonic() >= deadline:
                    result.stopped = "budget"
                    complete = False
                    break
                ahead.top_up(deadline)  # the pool compiles later keys meanwhile
                ready = ahead.ready(ki, _config_digest(cfg), deadline,
                                    lambda: report(phase="compiling"))
                if ready.status == "budget":
                    result.stopped = "budget"
                    complete = False
                    break
                c0 = time.monotonic()
                hold = False
                if thr.first_s is None:
                    thr.first_s = c0 - t0
                if ready.status == "infeasible":
                    m = rejected_row(spec.name, cfg, role, hashes[t.op], t.key, ready.error)
                else:
                    if inputs is None:
                        inputs = KeyInputs(spec, key, torch_device, seed,
                                           made=ahead.take_inputs(ki))
                    first = not best.warm
                    m, timing = measure(spec, key, cfg, role, inputs, torch_device, reps,
                                        hashes[t.op], t.key, best)
                    thr.pilot_only += bool(timing is not None and timing.pilot)
                    thr.gpu_s += time.monotonic() - c0
                    timed_after += held is not None and timing is not None
                    if first and timing is not None and not timing.pilot:
                        held = (cfg, role, m)  # recorded at the key's end
                        hold = True
                if not hold:
                    record(m)
                measure_s += time.monotonic() - c0
                measured_here += 1
                done += 1
                last = (f"{m.status} {m.median_us:.1f} us" if m.median_us is not None
                        else m.status)
                report(last)
            if held is not None:
                c0 = time.monotonic()
                cfg, role, m = held
                if complete and timed_after and inputs is not None:
                    again, _ = measure(spec, key, cfg, role, inputs, torch_device, reps,
                                       hashes[t.op], t.key, best)
                    m = retime_first(m, again)
                    thr.gpu_s += time.monotonic() - c0
                record(m)
            if inputs is not None:
                inputs.close()
                inputs = None
            ahead.forget(ki)
            if result.stopped:
                break
            if complete and mark_misses:
                store.mark_miss_tuned(t.op, t.key)
        status = "stopped" if result.stopped else "done"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        store.finish_run(result.run_id, status)
        thr.finish(t0, result.measured, jit.stop())
        ahead.account(thr)
    if summary:  # a worker's caller summarizes every worker's keys at once
        result.summaries = summarize(store, device, targets)
    return result


def summarize(store: Store, device: Device, targets: Sequence[TuneTarget]) -> list[KeySummary]:
    """Per-key summaries of ``targets`` from the database (current kernel sources only)."""
    out = []
    best_by_op: dict[str, dict[str, Any]] = {}
    for t in targets:
        spec = get_op(t.op)
        sh = spec.source_hash()
        if t.op not in best_by_op:
            best_by_op[t.op] = {r.key_digest: r for r in store.best(device.key, t.op)
                                if r.source_hash == sh}
        kd = digest(t.key)
        best = best_by_op[t.op].get(kd)
        heur = spec.heuristic(spec.parse_key(t.key)).model_dump(mode="json")
        hd = digest(heur)
        rows = [m for m in store.measurements(t.op, device.key, kd) if m.source_hash == sh
                and m.torch_version == store.toolchain["torch"]
                and m.triton_version == store.toolchain["triton"]]
        heur_us = [m.median_us for m in rows
                   if m.config_digest == hd and m.status == "ok" and m.median_us is not None]
        out.append(KeySummary(
            op=t.op, key=t.key, best_config=best.config if best else None,
            best_us=best.median_us if best else None, heuristic_config=heur,
            heuristic_us=min(heur_us) if heur_us else None,
            ok=sum(m.status == "ok" for m in rows),
            rejected=sum(m.status == "rejected" for m in rows),
            infeasible=sum(m.status == "infeasible" for m in rows)))
    return out


def tune_shard(targets: Sequence[TuneTarget], device_name: str, db_url: str, *,
               budget_minutes: float | None = None, seed: int = 0,
               mark_misses: bool = False,
               progress: Callable[[Progress], None] | None = None,
               claim: Callable[[int], bool] | None = None,
               compile_settings: CompileSettings | None = None,
               pool: Pool | None = None,
               first_to_feed: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Worker entry for one shard: its own device and store handle, the shared database.

    Picklable arguments only, so it runs under ``multiprocessing`` (spawn) or as a Ray task.
    Returns plain counts; read the summary with :func:`summarize` once all shards end.
    ``progress`` is called in the worker (e.g. to forward events to a queue); ``claim`` as
    in :func:`tune` (keys handed out on demand among local workers). ``pool`` is the host's
    compile pool (a :class:`~kdispatch.tuning.remote_pool.RemotePool`, fed each key once
    by whichever worker comes first: ``first_to_feed`` as in :func:`tune`); without one,
    ``compile_settings`` start a pool of this worker's own.
    """
    device, tdev = resolve_device(device_name)
    store = Store(db_url)
    target = compile_settings.target if compile_settings is not None else None
    try:
        with open_pool(None if pool is not None else compile_settings,
                       interpreter=device.is_interpreter) as own:
            res = tune(targets, device=device, torch_device=tdev, store=store,
                       budget_minutes=budget_minutes, seed=seed, mark_misses=mark_misses,
                       progress=progress, claim=claim, precompile=pool or own,
                       target=target, first_to_feed=first_to_feed if pool else None,
                       summary=False)
    finally:
        store.dispose()
    return {"device": device.key, "run_id": res.run_id, "measured": res.measured,
            "skipped": res.skipped, "stopped": res.stopped, "keys": res.keys,
            "throughput": res.throughput.as_dict()}
