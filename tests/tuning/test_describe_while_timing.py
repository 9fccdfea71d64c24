"""Describing keys for the compile pool overlaps the GPU's replays: ``time_call``'s ``idle``
runs once, after the last timed samples are queued and before the wait for them, and the
sweep passes the compile-ahead side's :meth:`~kdispatch.tuning.ahead.CompileAhead.top_up`
as that work (on the H200 the timing process spent 4.2 s of a 23.6 s llama3-8b tune
describing keys between candidates while the GPU idled: session 14, call 1)."""

from __future__ import annotations

import pytest

import fakecompile
import fakeops
from fakecuda import FakeCuda
from kdispatch.tuning import measure, sweep
from kdispatch.tuning.ahead import CompileAhead
from kdispatch.tuning.compile_pool import CompilePool
from kdispatch.tuning.timing import PILOT_REPS, time_call

US = 300.0


@pytest.fixture(autouse=True)
def ahead_op():
    fakecompile.install()
    yield
    fakeops.uninstall()


def _timed_replays(log: list[str]) -> int:
    """Graph replays between a start and an end event (the sizing replay and the samples)."""
    timed, inside = 0, False
    for e in log:
        if e == "record":
            inside = not inside
        elif e == "replay" and inside:
            timed += 1
    return timed


def _watch(gpu: FakeCuda, seen: list[tuple[int, int]]):
    """An ``idle`` that records (timed replays queued, synchronize calls) when it runs."""
    return lambda: seen.append((_timed_replays(gpu.log), gpu.syncs))


def test_idle_runs_once_after_every_sample_is_queued_and_before_the_wait(monkeypatch):
    gpu = FakeCuda(monkeypatch)
    seen: list[tuple[int, int]] = []
    t = time_call(gpu.kernel(US), "cuda", warmup=1, reps=12, idle=_watch(gpu, seen))
    assert t.reps == 12 and len(seen) == 1
    queued, syncs = seen[0]
    assert queued == 1 + 12  # the sizing replay and every timed sample
    assert gpu.syncs == syncs + 1  # the samples' wait comes after it


def test_with_a_pilot_idle_goes_with_the_rest_of_the_samples(monkeypatch):
    gpu = FakeCuda(monkeypatch)
    seen: list[tuple[int, int]] = []
    t = time_call(gpu.kernel(US), "cuda", warmup=1, reps=12, stop_above_us=10 * US,
                  idle=_watch(gpu, seen))
    assert not t.pilot and t.reps == 12
    assert [q for q, _ in seen] == [1 + 12]  # not after the pilot: no pause inside a run
    stopped: list[tuple[int, int]] = []
    t = time_call(gpu.kernel(US), "cuda", warmup=1, reps=12, stop_above_us=US / 2,
                  idle=_watch(gpu, stopped))
    assert t.pilot and t.reps == PILOT_REPS and stopped == []


def test_eager_timing_and_the_cpu_run_idle_as_the_protocol_says(monkeypatch):
    from kdispatch.tuning import timing

    gpu = FakeCuda(monkeypatch)
    seen = []
    t = timing._time_events([gpu.kernel(US)], US, 6, None, 0.0, lambda: seen.append(
        gpu.log.count("call")))
    assert t.reps == 6 and seen == [6]
    cpu = []
    time_call(lambda: None, "cpu", reps=3, idle=lambda: cpu.append(1))
    assert cpu == []  # the interpreter's wall-clock timing has nothing in flight


def test_the_sweep_runs_the_compile_ahead_work_inside_each_full_timing(store, monkeypatch):
    """With a compile pool, the host work of :meth:`CompileAhead.while_timing` runs inside
    every full timing, after its samples are queued; every row is as without it."""
    gpu = FakeCuda(monkeypatch)
    ran: list[int] = []  # timed replays queued when the work ran
    asked: list[float | None] = []

    def while_timing(self, deadline=None):
        asked.append(deadline)
        return lambda: ran.append(_timed_replays(gpu.log))

    def on_fake_gpu(fns, tdev, **kw):
        gpu.log.clear()
        return time_call(gpu.kernel(US), "cuda", **kw)

    monkeypatch.setattr(CompileAhead, "while_timing", while_timing)
    monkeypatch.setattr(measure, "time_call", on_fake_gpu)
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    with CompilePool(1, compiler=fakecompile.COMPILER) as pool:
        res = sweep.tune(targets, device=dev, torch_device=tdev, store=store, reps=5,
                         precompile=pool, target=fakecompile.TARGET)
    assert res.measured == len(targets) * len(fakeops.BLOCKS)
    ok = [m for m in store.measurements(op="tune_fake") if m.status == "ok"]
    full = [m for m in ok if not (m.error or "").startswith(measure.PILOT_NOTE)]
    assert full and len(ran) == len(full) and set(ran) == {1 + 5}  # after all 5 samples
    assert len(asked) >= len(ok)
    assert all(m.median_us == pytest.approx(US) for m in ok)


class _SlowPool:
    """A pool whose kernels compile one per moment waited (``wait`` with a timeout)."""

    workers = 1

    def __init__(self):
        self.items, self.done, self.waits = {}, [], 0

    def submit(self, items):
        self.items.update(items)

    def prioritize(self, ids):
        pass

    def wait(self, ids, timeout=None):
        from kdispatch.tuning.precompile import Outcome

        if timeout:
            self.waits += 1
            left = [i for i in self.items if i not in self.done]
            self.done += left[:1]
        return {v: Outcome("compiled") for v in ids if v in self.done}

    def stats(self):
        return None


def _keyed_ahead(monkeypatch, busy_polls: int):
    """A compile-ahead side over the keyed fake op's keys (each key its own kernels), key 0
    described, and a GPU busy for ``busy_polls`` checks."""
    import torch

    from kdispatch.registry import get_op
    from kdispatch.store import digest
    from kdispatch.tuning import ahead as ahead_mod
    from kdispatch.tuning.plan import candidate_list

    fakeops.uninstall()
    fakecompile.install(keyed=True)
    polls = [busy_polls]

    def busy_for(_dev):
        def busy():
            polls[0] -= 1
            return polls[0] >= 0
        return busy

    monkeypatch.setattr(ahead_mod, "_gpu_busy", busy_for)
    dev, _ = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    work = []
    for ki, t in enumerate(targets):
        op = get_op(t.op)
        key = op.parse_key(t.key)
        work.append((ki, op, key, [(digest(c.model_dump(mode="json")), c)
                                   for c, _ in candidate_list(op, key)]))
    pool = _SlowPool()
    ahead = CompileAhead(pool, fakecompile.TARGET, torch.device("cpu"), workers=1)
    ahead.plan(work)
    ahead.own(0)
    return ahead, pool


def test_while_the_gpu_runs_idle_waits_for_the_pool_and_describes_the_next_key(monkeypatch):
    ahead, pool = _keyed_ahead(monkeypatch, busy_polls=100)
    first = len(pool.items)
    assert first > 1 and not ahead.described(1)
    before = ahead.stats.describe_s
    ahead.while_timing()()
    # it waited until key 0's kernels compiled, then described keys 1 and 2 (as long as
    # the GPU was busy, one key per drained pool)
    assert ahead.described(1) and ahead.described(2)
    assert pool.waits >= first and len(pool.items) > first
    assert 0.0 < ahead.stats.overlap_s == pytest.approx(ahead.stats.describe_s - before)


def test_once_the_gpu_is_done_idle_returns_without_waiting(monkeypatch):
    ahead, pool = _keyed_ahead(monkeypatch, busy_polls=0)
    ahead.while_timing()()
    assert pool.waits == 0 and not ahead.described(1)  # the pool is full: nothing to do


def test_while_timing_is_none_without_a_pool_or_once_every_key_is_described():
    import torch

    assert CompileAhead(None, None, torch.device("cpu")).while_timing() is None
    ahead = CompileAhead(object(), fakecompile.TARGET, torch.device("cpu"))
    assert ahead.while_timing() is None  # nothing planned: nothing left to describe
