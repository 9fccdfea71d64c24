"""Tuning shards as Ray tasks: every GPU of a cluster (or a local one), one shared database.

``kdispatch tune --ray [ADDRESS]`` plans the keys for the cluster's device, splits them into
shards (:func:`kdispatch.tuning.sweep.shard`) and runs each shard as a Ray task that asks for
one GPU (``num_gpus=1``; ``num_gpus=0`` for the CPU interpreter). Each task calls
:func:`kdispatch.tuning.parallel.run_shard`, which tunes into the shared database URL, so
the summary is read back from that database at the end.

A task whose worker dies (a killed process, a lost node) is retried by Ray up to
``max_retries`` times; the retry resumes, because the sweep skips every config already
measured for the same kernel source hash and toolchain, so nothing committed is measured
again. Errors raised by the sweep itself are not retried: they are reported by shard.

Ray is an optional extra (``pip install "kdispatch[ray]"``) and is imported lazily. On a
real cluster every node needs kdispatch (and the module of any op registered at run time)
installed, and the database must be one every node reaches: a PostgreSQL URL, not a local
SQLite file.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from kdispatch.device import Device
from kdispatch.registry import get_op
from kdispatch.store import digest
from kdispatch.tuning import parallel, sweep
from kdispatch.tuning.parallel import Job, UpdateFn, WorkerResult
from kdispatch.tuning.sweep import TuneTarget, TuningError

INSTALL_HINT = 'Ray is not installed: pip install "kdispatch[ray]" (or pip install "ray>=2.9")'
#: seconds between progress polls of the database
POLL_S = 1.0

log = logging.getLogger(__name__)


class RayUnavailable(TuningError):
    """``--ray`` was asked for but Ray cannot be imported."""


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayUnavailable` telling the user to install the extra."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable(INSTALL_HINT) from exc
    return ray


@contextlib.contextmanager
def connect(address: str | None) -> Iterator[Any]:
    """Connect to the cluster at ``address`` (``auto``, ``ray://head:10001``), or start a
    local one when ``address`` is empty; disconnect (and stop a local one) at the end.

    An already initialized Ray (e.g. a test's ``ray.init``) is used as it is and left up.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def cluster_gpus(ray: Any) -> int:
    """GPUs the connected cluster reports."""
    return int(ray.cluster_resources().get("GPU", 0))


def _probe() -> dict[str, Any]:
    import torch

    return Device.from_torch(torch.device("cuda", 0)).model_dump()


def probe_device(ray: Any) -> Device:
    """The dispatch device of a cluster GPU, read by a one-GPU task (the driver may have none).

    Raises
    ------
    TuningError
        The cluster reports no GPU.
    """
    if cluster_gpus(ray) < 1:
        raise TuningError("the Ray cluster reports no GPU; use --device cpu to tune the "
                          "Triton interpreter, or connect to a cluster with GPUs")
    return Device(**ray.get(ray.remote(num_gpus=1, max_retries=1)(_probe).remote()))


def make_jobs(targets: Sequence[TuneTarget], device: Device, shards: int) -> list[Job]:
    """The keys split into ``shards`` tasks (empty shards dropped).

    Every task of a GPU run names ``cuda:0``: Ray gives each task one GPU through
    ``CUDA_VISIBLE_DEVICES``.
    """
    name = "cpu" if device.is_interpreter else "cuda:0"
    jobs = []
    for part in sweep.shard(targets, shards):
        if part:
            jobs.append(Job(len(jobs), name, device.key, tuple(part)))
    return jobs


def _ray_shard(targets: Sequence[TuneTarget], device_name: str, db_url: str,
               options: dict[str, Any], extra: bytes) -> dict[str, Any]:
    """The Ray task body: one shard (resumes from the database when retried)."""
    return parallel.run_shard(targets, device_name, db_url, options, extra)


def _task_error(ray: Any, exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class _Counter:
    """Candidates planned / measured for the jobs' keys, read from the database."""

    def __init__(self, store: Any, jobs: Sequence[Job]):
        self.store = store
        self.items = []
        self.total = 0
        for job in jobs:
            for t in job.targets:
                spec = get_op(t.op)
                key = spec.parse_key(t.key)
                digests = {digest(c.model_dump(mode="json"))
                           for c, _ in sweep.candidate_list(spec, key, t.max_candidates)}
                self.items.append((t, spec.source_hash(), digests))
                self.total += len(digests)

    def done(self) -> int:
        return sum(len(d & self.store.measured_configs(t.op, t.key, h))
                   for t, h, d in self.items)


def run_ray(jobs: Sequence[Job], store: Any, ray: Any, *, max_retries: int = 3,
            budget_minutes: float | None = None, seed: int = 0, mark_misses: bool = False,
            on_update: UpdateFn | None = None) -> list[WorkerResult]:
    """Run each job as a Ray task on the connected cluster and wait for all of them.

    Parameters
    ----------
    jobs : sequence of Job
        From :func:`make_jobs`.
    store : Store
        The shared database (its URL goes to the tasks; progress is read from it).
    ray : module
        The connected ``ray`` module (from :func:`connect`).
    max_retries : int
        Retries of a task whose worker process died; a retry resumes.
    budget_minutes, seed, mark_misses
        Passed to every task's sweep.
    on_update : callable, optional
        ``on_update(done, total, description)``: candidates measured for the planned keys
        (all of them, including any measured before this run) over those planned.

    Returns
    -------
    list of WorkerResult
        One per job, in job order; failures name the error (after Ray's retries).
    """
    if not jobs:
        return []
    gpu = jobs[0].device_name != "cpu"
    options = {"budget_minutes": budget_minutes, "seed": seed, "mark_misses": mark_misses}
    extra = parallel.extra_specs(t.op for j in jobs for t in j.targets)
    task = ray.remote(_ray_shard).options(
        num_gpus=1 if gpu else 0, num_cpus=1, max_retries=max_retries,
        retry_exceptions=False, name="kdispatch-tune-shard")
    refs = {task.remote(list(j.targets), j.device_name, store.url, options, extra): j
            for j in jobs}
    results = {j.index: WorkerResult(j.index, f"{j.device_key} (Ray shard {j.index})")
               for j in jobs}
    counter = _Counter(store, jobs) if on_update is not None else None
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in ready:
                r = results[refs[ref].index]
                try:
                    r.counts = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    r.error = _task_error(ray, exc)
            if counter is not None:
                on_update(counter.done(), counter.total,
                          f"{len(jobs)} Ray tasks, {len(pending)} running")
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return [results[j.index] for j in jobs]


def default_shards(ray: Any, device: Device) -> int:
    """GPUs the cluster reports (one task per GPU), or 2 for the CPU interpreter."""
    if device.is_interpreter:
        return 2
    return max(cluster_gpus(ray), 1)



def tune_cluster(device: str, address: str | None, shards: int | None, max_retries: int,
                 store: Any, plan: dict[str, Any], run: dict[str, Any], ui: parallel.Reporter,
                 ) -> tuple[list[parallel.GroupRun], list[WorkerResult]]:
    """``--ray [ADDRESS]``: plan for the cluster's device, run the shards as tasks, summarize.

    Parameters
    ----------
    device : str
        ``"cpu"`` (interpreter tasks, ``num_gpus=0``) or ``"auto"``/``"all"``/``"cuda"``
        (one GPU per task; the device is probed on the cluster).
    address : str, optional
        Cluster address (``auto``, ``ray://head:10001``); None starts a local cluster.
    shards : int, optional
        Number of tasks (default: :func:`default_shards`).
    max_retries : int
        Ray retries of a task whose worker died.
    store, plan, run, ui
        As in :func:`kdispatch.tuning.parallel.tune_devices`.

    Raises
    ------
    RayUnavailable
        Ray is not installed.
    TuningError
        A device other than cpu/auto, or no GPU on the cluster.
    """
    name = device.strip().lower()
    if name not in ("auto", "all", "cuda", "cpu"):
        raise TuningError(f"--device {device!r}: with --ray, use auto (the cluster's GPUs) "
                          "or cpu")
    import_ray()
    if name == "cpu":
        sweep.use_interpreter()
    if address and store.path is not None:
        log.warning("%s is a SQLite file: every Ray node must see this same file; use a "
                    "PostgreSQL URL for a cluster", store.url)
    with connect(address) as ray:
        dev = Device.interpreter() if name == "cpu" else probe_device(ray)
        n = shards or default_shards(ray, dev)
        targets, notes = parallel.plan_targets(store, dev, **plan)
        if not ui.announce(dev, targets, notes, store, plan.get("from_misses", False),
                           f"; {n} Ray shards on {address or 'a local cluster'}"):
            return [], []
        jobs = make_jobs(targets, dev, n)
        with ui.progress() as on_update:
            results = run_ray(jobs, store, ray, max_retries=max_retries, on_update=on_update,
                              **run)
    group = parallel.DeviceGroup(dev, tuple(j.device_name for j in jobs))
    return [parallel.GroupRun(group, targets, notes, sweep.summarize(store, dev, targets))], \
        results
