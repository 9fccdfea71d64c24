"""The sweep driver: tune a list of op keys on one device into the database.

For each key: enumerate the op's candidates, prune them with ``is_valid``, always add the
heuristic's config (and the baseline), skip configs already measured for this key, kernel
source hash and toolchain (resume), then verify every remaining candidate against the fp32
reference on random inputs and time the ones that pass. Every measurement is committed as
it completes, so a killed tuner loses at most the candidate in flight.

The work is a plain list of :class:`TuneTarget` (op name + key as JSON data), so it can be
split with :func:`shard` and run by worker processes (:func:`tune_shard`), each with its own
device, all writing to one database; :func:`summarize` reads the result back from the
database, so one summary covers every shard.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kdispatch.device import Device
from kdispatch.registry import OpConfig, OpSpec, get_op
from kdispatch.store import MeasurementIn, Store, digest
from kdispatch.tuning import presets as _presets
from kdispatch.tuning.timing import Timing, time_call
from kdispatch.tuning.verify import Verdict, describe, infeasible_errors, verify

log = logging.getLogger(__name__)

#: extra input sets for L2 rotation are capped at this many bytes in total
ROTATION_BYTES = 2 << 30
MAX_INPUT_SETS = 8


Role = Literal["heuristic", "baseline", "candidate"]


class TuningError(RuntimeError):
    """The sweep cannot run as asked (no such device, interpreter mode mixed up, ...)."""


@dataclass(frozen=True)
class TuneTarget:
    """One key to tune: the op name and the key as JSON data (picklable, for workers)."""

    op: str
    key: dict[str, Any]
    max_candidates: int | None = None


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


# -- devices -----------------------------------------------------------------------------------
def _kernel_modules_loaded() -> list[str]:
    return sorted(m for m in sys.modules
                  if m.startswith("kdispatch.kernels.") and m != "kdispatch.kernels._common")


def use_interpreter() -> None:
    """Select the Triton interpreter for this process (``TRITON_INTERPRET=1``).

    It must happen before any kernel module is imported (Triton decides at decoration).

    Raises
    ------
    TuningError
        When kernel modules were already imported in compiled mode.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    loaded = _kernel_modules_loaded()
    if loaded:
        raise TuningError(
            "--device cpu needs the Triton interpreter, but kernel modules were already "
            f"imported in compiled mode ({', '.join(loaded)}); set TRITON_INTERPRET=1 before "
            "importing kdispatch kernels, or run the tuner in a fresh process")
    os.environ["TRITON_INTERPRET"] = "1"


def check_kernel_mode(spec: OpSpec, interpreter: bool) -> None:
    """Raise TuningError if ``spec``'s Triton kernels were built for the other mode."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:  # pragma: no cover
        return
    for name in spec.source_modules:
        mod = sys.modules.get(name)
        for value in vars(mod).values() if mod else ():
            fn, depth = value, 0
            while depth < 4 and not isinstance(fn, JITFunction | InterpretedFunction) \
                    and hasattr(fn, "fn"):
                fn, depth = fn.fn, depth + 1
            if interpreter and isinstance(fn, JITFunction):
                raise TuningError(f"{name} was imported in compiled mode; --device cpu needs "
                                  "TRITON_INTERPRET=1 before kdispatch's kernels are imported")
            if not interpreter and isinstance(fn, InterpretedFunction):
                raise TuningError(f"{name} was imported under TRITON_INTERPRET=1; GPU tuning "
                                  "needs compiled kernels: unset TRITON_INTERPRET")


def resolve_device(name: str) -> tuple[Device, Any]:
    """The dispatch device and torch device for ``"cpu"``, ``"auto"`` or ``"cuda:N"``.

    ``"cpu"`` selects the Triton interpreter (see :func:`use_interpreter`); its keys use the
    interpreter device and never mix with a GPU's.
    """
    import torch

    name = name.strip().lower()
    if name in ("cpu", "interpreter", "cpu-interpreter"):
        use_interpreter()
        return Device.interpreter(), torch.device("cpu")
    if name == "auto" or name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise TuningError(f"device {name!r}: no CUDA/HIP GPU is available here; use "
                              "--device cpu to exercise the pipeline on the Triton interpreter")
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise TuningError("TRITON_INTERPRET=1 is set: GPU tuning needs compiled kernels")
        index = torch.cuda.current_device() if name in ("auto", "cuda") else None
        if index is None:
            try:
                index = int(name.split(":", 1)[1])
            except ValueError:
                raise TuningError(f"device {name!r}: expected cuda:N") from None
        if not 0 <= index < torch.cuda.device_count():
            raise TuningError(f"device {name!r}: this host has {torch.cuda.device_count()} GPUs")
        torch.cuda.set_device(index)
        tdev = torch.device("cuda", index)
        return Device.from_torch(tdev), tdev
    raise TuningError(f"device {name!r}: expected cpu, auto or cuda:N")


# -- planning ----------------------------------------------------------------------------------
def plan(device: Device, preset_names: Iterable[str], ops: Iterable[str] | None = None,
         ) -> tuple[list[TuneTarget], list[str]]:
    """The deduplicated keys of the named presets for ``device``.

    Returns
    -------
    targets : list of TuneTarget
    notes : list of str
        Optional entries skipped because the op rejected their shape.
    """
    targets: list[TuneTarget] = []
    notes: list[str] = []
    seen: set[tuple[str, str]] = set()
    for pname in preset_names:
        preset = _presets.get_preset(pname)
        for entry in _presets.expand([pname], ops):
            spec = get_op(entry.op)
            try:
                key = spec.key(device, dict(entry.args))
                spec.heuristic(key)
            except ValueError as exc:
                if not entry.optional:
                    raise TuningError(f"preset {pname}: {entry.op} {dict(entry.args)}: "
                                      f"{str(exc).splitlines()[0]}") from exc
                note = (f"{pname}: skipped {entry.op} {dict(entry.args)}: "
                        f"{str(exc).splitlines()[0]}")
                if note not in notes:
                    notes.append(note)
                continue
            data = key.model_dump(mode="json")
            k = (entry.op, digest(data))
            if k not in seen:
                seen.add(k)
                targets.append(TuneTarget(entry.op, data, preset.max_candidates))
    return targets, notes


def plan_misses(store: Store, device: Device, ops: Iterable[str] | None = None,
                ) -> tuple[list[TuneTarget], list[str]]:
    """The keys the store recorded as heuristic misses for ``device`` (not yet tuned)."""
    wanted = set(ops) if ops else None
    targets, notes = [], []
    for op, key in store.misses(device_key=device.key):
        if wanted is not None and op not in wanted:
            continue
        try:
            spec = get_op(op)
            data = spec.parse_key(key).model_dump(mode="json")
        except ValueError as exc:
            notes.append(f"miss {op} {key}: not tunable here: {str(exc).splitlines()[0]}")
            continue
        targets.append(TuneTarget(op, data))
    return targets, notes


def shard(targets: Sequence[TuneTarget], n: int) -> list[list[TuneTarget]]:
    """Split targets into ``n`` shards round-robin (keys of one op spread over workers).

    >>> [len(s) for s in shard([TuneTarget("x", {"i": i}) for i in range(5)], 2)]
    [3, 2]
    """
    if n < 1:
        raise ValueError(f"n: need at least one shard, got {n}")
    return [list(targets[i::n]) for i in range(n)]


def candidate_list(spec: OpSpec, key: Any, cap: int | None = None,
                   ) -> list[tuple[OpConfig, Role]]:
    """Valid candidates of ``key`` as (config, role); heuristic first, baseline next.

    The role is ``"heuristic"``, ``"candidate"``, or ``"baseline"`` for the op's baseline
    when it is not itself in the pruned candidate space: such a config is timed for
    comparison only and is never stored as a best config (kv_write's indexed writes cannot
    skip negative slots, so a table must never select them). With ``cap``, the heuristic
    and baseline are kept, then the first half of the remaining room in the op's order
    (its closest variants of the heuristic), then the rest sampled evenly.
    """
    heur = spec.heuristic(key)
    out: dict[str, tuple[OpConfig, Role]] = {}
    out[digest(heur.model_dump(mode="json"))] = (heur, "heuristic")
    rest: list[tuple[OpConfig, Role]] = []
    space: set[str] = set()
    for cfg in spec.candidates(key):
        d = digest(cfg.model_dump(mode="json"))
        if d not in out and spec.is_valid(key, cfg):
            out[d] = (cfg, "candidate")
            rest.append((cfg, "candidate"))
        space.add(d)
    chosen = [out[digest(heur.model_dump(mode="json"))]]
    base = spec.baseline(key)
    if base is not None and spec.is_valid(key, base):
        d = digest(base.model_dump(mode="json"))
        if d not in out or out[d][1] == "candidate":
            role: Role = "candidate" if d in space else "baseline"
            rest = [r for r in rest if digest(r[0].model_dump(mode="json")) != d]
            chosen.append((base, role))
    if cap is not None and len(chosen) + len(rest) > cap:
        # the first half of the room in the op's order (specs list the most telling
        # variants of the heuristic first), the other half spread over the remainder
        room = max(cap - len(chosen), 0)
        head = (room + 1) // 2
        tail = rest[head:]
        step = len(tail) / (room - head) if room > head else 0
        rest = rest[:head] + [tail[int(i * step)] for i in range(room - head)]
    return chosen + rest


# -- tuning ------------------------------------------------------------------------------------
def _config_digest(cfg: OpConfig) -> str:
    return digest(cfg.model_dump(mode="json"))


def _storage_bytes(inputs: dict[str, Any]) -> int:
    import torch

    seen, total = set(), 0
    for v in inputs.values():
        if isinstance(v, torch.Tensor):
            st = v.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
    return total


def _warn_zero_inputs(op: str, inputs: dict[str, Any]) -> None:
    import torch

    for name, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() \
                and not bool(v.any()):
            log.warning("%s: make_inputs gave an all-zero %r; timing on zeros flatters "
                        "kernels (random inputs expected)", op, name)


def _rotation_sets(spec: OpSpec, key: Any, tdev: Any, seed: int,
                   first: dict[str, Any]) -> list[dict[str, Any]]:
    """Input sets to cycle through while timing, so small working sets are not timed hot."""
    import torch

    if tdev.type != "cuda":
        return [first]
    l2 = int(getattr(torch.cuda.get_device_properties(tdev), "L2_cache_size", 0) or 0)
    moved = max(int(spec.bytes_moved(key)), 1)
    if not l2 or moved >= 4 * l2:
        return [first]
    per_set = max(_storage_bytes(first), 1)
    n = min(MAX_INPUT_SETS, math.ceil(4 * l2 / moved), max(1, ROTATION_BYTES // per_set))
    return [first] + [spec.make_inputs(key, tdev, seed + 1000 + i) for i in range(n - 1)]


def _timed(spec: OpSpec, config: OpConfig, sets: list[dict[str, Any]], tdev: Any,
           reps: int | None) -> Timing | Verdict:
    fns = [lambda inp=inp: spec.run(config, inp) for inp in sets]
    try:
        return time_call(fns, tdev, reps=reps)
    except infeasible_errors() as exc:
        return Verdict("infeasible", None, f"while timing: {describe(exc)}")


def tune(targets: Sequence[TuneTarget], *, device: Device, torch_device: Any, store: Store,
         budget_minutes: float | None = None,
         progress: Callable[[Progress], None] | None = None, seed: int = 0,
         mark_misses: bool = False, reps: int | None = None,
         claim: Callable[[int], bool] | None = None) -> SweepResult:
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
        list take keys on demand, so a worker that drew cheap keys takes more of them.

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

    result = SweepResult(device=device, run_id=None, summaries=[])
    result.run_id = store.start_run(device, hashes)
    done = measured_here = 0
    measure_s = 0.0
    status = "failed"
    try:
        for ki, (t, spec, key, todo, measured_before) in enumerate(work):
            if claim is not None and not claim(ki):
                continue
            result.keys += 1
            result.skipped += measured_before

            def report(last: str = "") -> None:
                if progress is None:
                    return
                eta = measure_s / measured_here * (total - done) if measured_here else None
                progress(Progress(t.op, t.key, ki, len(work), done, total,
                                  time.monotonic() - t0, eta, last))

            report()
            complete = True
            ref = None
            for cfg, role in todo:
                if deadline is not None and time.monotonic() >= deadline:
                    result.stopped = "budget"
                    complete = False
                    break
                if _config_digest(cfg) in store.measured_configs(t.op, t.key, hashes[t.op]):
                    result.skipped += 1  # another tuner measured it meanwhile
                    done += 1
                    report("measured elsewhere")
                    continue
                c0 = time.monotonic()
                if ref is None:
                    ref_inputs = spec.make_inputs(key, torch_device, seed)
                    ref = spec.reference(ref_inputs)
                    del ref_inputs
                m = _measure(spec, key, cfg, role, ref, torch_device, seed, reps,
                             hashes[t.op], t.key)
                if store.record(m, result.run_id):
                    result.measured += 1
                else:
                    result.skipped += 1
                measure_s += time.monotonic() - c0
                measured_here += 1
                done += 1
                last = (f"{m.status} {m.median_us:.1f} us" if m.median_us is not None
                        else m.status)
                report(last)
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
    result.summaries = summarize(store, device, targets)
    return result


def _measure(spec: OpSpec, key: Any, cfg: OpConfig, role: Role, ref: Any, tdev: Any,
             seed: int, reps: int | None, source_hash: str,
             key_data: dict[str, Any]) -> MeasurementIn:
    """Verify then time one candidate on fresh inputs; never raises for infeasible configs."""
    inputs = spec.make_inputs(key, tdev, seed)
    _warn_zero_inputs(spec.name, inputs)
    verdict = verify(spec, key, cfg, inputs, ref)
    timing: Timing | None = None
    if verdict.ok:
        sets = _rotation_sets(spec, key, tdev, seed, inputs)
        got = _timed(spec, cfg, sets, tdev, reps)
        del sets
        if isinstance(got, Verdict):
            verdict = Verdict(got.status, verdict.max_error, got.error)
        else:
            timing = got
    del inputs
    return MeasurementIn(
        op=spec.name, key=key_data, config=cfg.model_dump(mode="json"),
        source_hash=source_hash, status=verdict.status, verified=verdict.ok,
        is_heuristic=role == "heuristic", is_baseline=role == "baseline",
        median_us=timing.median_us if timing else None,
        p20_us=timing.p20_us if timing else None,
        p80_us=timing.p80_us if timing else None,
        max_error=verdict.max_error if verdict.max_error is None
        or math.isfinite(verdict.max_error) else None,
        error=verdict.error)


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
               claim: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Worker entry for one shard: its own device and store handle, the shared database.

    Picklable arguments only, so it runs under ``multiprocessing`` (spawn) or as a Ray task.
    Returns plain counts; read the summary with :func:`summarize` once all shards end.
    ``progress`` is called in the worker (e.g. to forward events to a queue); ``claim`` as
    in :func:`tune` (keys handed out on demand among local workers).
    """
    device, tdev = resolve_device(device_name)
    store = Store(db_url)
    try:
        res = tune(targets, device=device, torch_device=tdev, store=store,
                   budget_minutes=budget_minutes, seed=seed, mark_misses=mark_misses,
                   progress=progress, claim=claim)
    finally:
        store.dispose()
    return {"device": device.key, "run_id": res.run_id, "measured": res.measured,
            "skipped": res.skipped, "stopped": res.stopped, "keys": res.keys}
