"""A key's first timed candidate is timed after a warm-up that replays the graph in batches
until the GPU is steady (at most KEY_WARMUP_MS), so the heuristic, timed first at every key,
is not measured on a GPU still ramping up after making the key's inputs (llama b4 x 262k on
the H200: ~14% slower than identical twins timed after it, with no warm-up and with a fixed
5 ms one; a fixed 200 ms removed it).

The simulated GPU (:mod:`fakecuda`) ramps: a call is RAMP slower at a key's start and reaches
its steady time linearly over the first ramp_ms of activity."""

from __future__ import annotations

import doctest
import json
import math

import pytest

import fakeops
from fakecuda import FakeCuda
from kdispatch.tuning import measure, sweep, timing, warmup
from kdispatch.tuning.measure import KEY_WARMUP_MS, KeyBest
from kdispatch.tuning.timing import Timing, time_call
from kdispatch.tuning.warmup import (WARM_BATCH_MS, WARM_MAX_REPS, WARM_MIN_REPS, warm_batch,
                                     warm_until_steady)

US = 950.0  # one call: a ~1 ms decode kernel (one call per graph)
RAMP, RAMP_MS = 0.15, 60.0  # 15% slower at a key's start, steady after 60 ms of activity
K = warm_batch(US)  # replays in one warm-up batch of the 950 us graph


def ramp(start_ms: list[float], ramp_ms: float = RAMP_MS, us: float = US):
    """A call's time at clock ``now`` (ms): slow by RAMP at ``start_ms[0]``, then linearly
    faster until ``ramp_ms`` later, then ``us``."""
    def t(now: float) -> float:
        return us * (1.0 + RAMP * max(0.0, 1.0 - (now - start_ms[0]) / ramp_ms))
    return t


def one_fixed_batch(take, sample_us, cap_ms):
    """The control: the warm-up replaced by a single fixed ~5 ms batch (no adapting)."""
    return [timing.quantile(take(warm_batch(sample_us)), 0.5)] if cap_ms > 0 else []


@pytest.fixture(autouse=True)
def fake_op():
    fakeops.install()
    yield fakeops.SPEC
    fakeops.uninstall()


def _replays(log: list[str]) -> list[str]:
    """Each graph replay in ``log`` as "timed" (between a start and an end event: the
    protocol records them in pairs) or "untimed"."""
    out, timing_now = [], False
    for e in log:
        if e == "record":
            timing_now = not timing_now
        elif e == "replay":
            out.append("timed" if timing_now else "untimed")
    return out


def test_doctests():
    assert doctest.testmod(warmup).failed == 0 and doctest.testmod(timing).failed == 0


def test_a_warm_up_batch_lasts_about_warm_batch_ms():
    assert WARM_BATCH_MS == 5.0 and K == 6  # 5.7 ms
    assert warm_batch(200.0) == 25
    assert warm_batch(20000.0) == WARM_MIN_REPS == 3  # a long sample: a few
    assert warm_batch(0.0) == WARM_MAX_REPS == timing.MAX_REPS


def test_warm_until_steady_stops_when_a_batch_is_no_faster():
    assert warm_until_steady(lambda k: [US] * k, US, 200.0) == [US, US]  # warm: two batches
    assert warm_until_steady(lambda k: [US] * k, US, 0.0) == []  # no warm-up
    assert warm_until_steady(lambda k: [US] * k, US, -1.0) == []
    # 0.2% faster is noise, not a ramp: steady
    speeds = iter([US * 1.002, US, US])
    assert len(warm_until_steady(lambda k: [next(speeds)] * k, US, 200.0)) == 2
    # a batch slower than the one before (noise) is steady too
    speeds = iter([US, US * 1.01, US])
    assert len(warm_until_steady(lambda k: [next(speeds)] * k, US, 200.0)) == 2
    # 1.10, 1.08, ... 1.00 x US (each batch ~2% faster), then steady: the last one repeated
    speeds = iter([US * (1.1 - 0.02 * min(i, 5)) for i in range(40)])
    got = warm_until_steady(lambda k: [next(speeds)] * k, US, 200.0)
    assert len(got) == 7 and got[-1] == got[-2] == pytest.approx(US)


def test_the_median_of_a_batch_decides():
    """One slow replay in a batch (an outlier) does not keep the warm-up going."""
    batches = iter([[US] * K, [US] * (K - 1) + [3 * US], [US] * K])
    assert len(warm_until_steady(lambda k: next(batches), US, 200.0)) == 2


def test_the_cap_bounds_a_gpu_that_never_settles():
    speeds = iter(US * (2.0 - 0.02 * i) for i in range(1000))  # each batch 1-1.3% faster
    spent: list[float] = []

    def take(k):
        batch = [next(speeds)] * k
        spent.append(sum(batch) / 1000)
        return batch

    got = warm_until_steady(take, US, KEY_WARMUP_MS)
    assert sum(spent) >= KEY_WARMUP_MS and sum(spent[:-1]) < KEY_WARMUP_MS  # one past it
    assert len(got) == len(spent) > 2
    # batches that report (almost) no time: at most twice cap / WARM_BATCH_MS of them
    faster = iter(0.5 ** i for i in range(1000))
    got = warm_until_steady(lambda k: [next(faster)] * k, US, KEY_WARMUP_MS)
    assert len(got) == 2 * math.ceil(KEY_WARMUP_MS / WARM_BATCH_MS) == 80


@pytest.mark.parametrize("warm_ms", [0.0, KEY_WARMUP_MS])
def test_a_warm_gpu_stops_after_two_batches(monkeypatch, warm_ms):
    """On a GPU warm from the start: the capture's check replay, the timed sizing replay,
    two warm-up batches (timed with events, like samples, but not samples), the samples."""
    gpu = FakeCuda(monkeypatch)
    t = time_call(gpu.kernel(US), "cuda", warmup=1, reps=8, warm_ms=warm_ms)
    assert (t.method, t.calls_per_sample, t.reps) == ("cuda-graph", 1, 8)
    assert t.median_us == pytest.approx(US)
    warm = 2 * K if warm_ms else 0
    assert _replays(gpu.log) == ["untimed", "timed"] + ["timed"] * (warm + 8)
    assert gpu.log[:3] == ["record", "call", "record"]  # first, the eager estimating call
    assert gpu.now_ms == pytest.approx((1 + 2 + warm + 8) * US / 1000)  # ~10 ms of warm-up


@pytest.mark.parametrize("warm_ms", [0.0, KEY_WARMUP_MS])
def test_eager_timing_warms_up_with_batches_of_eager_calls(monkeypatch, warm_ms):
    """Without a graph (capture failed) the warm-up is the same, with timed eager calls."""
    gpu = FakeCuda(monkeypatch)
    t = timing._time_events([gpu.kernel(US)], US, 4, None, warm_ms)
    assert t.method == "cuda-events" and t.reps == 4
    warm = 2 * K if warm_ms else 0
    assert gpu.log == ["record", "call", "record"] * (warm + 4)


def test_eager_timing_warms_a_ramp_away(monkeypatch):
    gpu = FakeCuda(monkeypatch)
    t = timing._time_events([gpu.kernel(ramp([0.0]))], US, 5, None, KEY_WARMUP_MS)
    assert t.median_us == pytest.approx(US)
    assert gpu.calls > RAMP_MS * 1000 / (US * (1 + RAMP))  # it warmed through the ramp


@pytest.mark.parametrize("ramp_ms", [20.0, RAMP_MS, 120.0])
@pytest.mark.parametrize("warm_up", ["adaptive", "none", "one fixed batch"])
def test_a_ramping_gpu_is_warmed_until_steady(monkeypatch, ramp_ms, warm_up):
    """The adaptive warm-up replays until the ramp is over, so the samples are the steady
    time; without a warm-up, or with one fixed ~5 ms batch (the controls), they are slow."""
    gpu = FakeCuda(monkeypatch)
    if warm_up == "one fixed batch":
        monkeypatch.setattr(timing, "warm_until_steady", one_fixed_batch)
    t = time_call(gpu.kernel(ramp([0.0], ramp_ms)), "cuda", warmup=1, reps=5,
                  warm_ms=0.0 if warm_up == "none" else KEY_WARMUP_MS)
    if warm_up == "adaptive":
        assert t.median_us == pytest.approx(US)
        warm = gpu.replays - 2 - 5  # less the capture's check and the sizing replay
        assert warm > 2 * K  # more than a warm GPU's two batches
        end = gpu.replay_at[2 + warm]  # the warm-up's end: the ramp's, and a batch or two
        assert ramp_ms <= end < ramp_ms + 2.5 * WARM_BATCH_MS * (1 + RAMP)
    else:
        assert t.median_us > US * 1.01


def test_the_cap_bounds_a_gpu_that_never_settles_on_a_simulated_gpu(monkeypatch):
    """Each batch of ~5 ms ~1.4% faster than the last, for 400 ms: the warm-up stops at
    the cap."""
    gpu = FakeCuda(monkeypatch)
    t = time_call(gpu.kernel(lambda now: US * (2.0 - now / 400.0)), "cuda", warmup=1, reps=5,
                  warm_ms=KEY_WARMUP_MS)
    assert t.reps == 5
    warm = gpu.replays - 2 - 5
    span = gpu.replay_at[2 + warm] - gpu.replay_at[2]  # the warm-up batches' GPU time
    assert KEY_WARMUP_MS <= span < KEY_WARMUP_MS + 2 * WARM_BATCH_MS


def test_key_best_is_warm_after_any_timing_only():
    best = KeyBest()
    assert best.warm_ms() == KEY_WARMUP_MS == 200.0
    best.update("candidate", None)  # rejected or infeasible: never timed
    assert best.warm_ms() == KEY_WARMUP_MS
    best.update("baseline", Timing(1.0, 1.0, 1.0, 5))  # timed (sets no bar, but warmed)
    assert best.warm_ms() == 0.0 and best.us is None
    pilot = KeyBest()
    pilot.update("candidate", Timing(1.0, 1.0, 1.0, 5, pilot=True))
    assert pilot.warm_ms() == 0.0


@pytest.mark.parametrize("warm_up", ["adaptive", "none", "one fixed batch"])
def test_each_keys_first_timed_candidate_is_warmed_up(store, monkeypatch, warm_up):
    """A sweep over the fake op's keys on a simulated GPU that ramps up over RAMP_MS after
    each key's inputs are made, every candidate a twin (the same 950 us kernel): with the
    adaptive warm-up, every row (the heuristic's first) is 950 us; without it, or with one
    fixed ~5 ms batch (the controls), each key's first timed candidate is measured slow. At
    n=256 the heuristic is wrong, so the warm-up goes to the first candidate that is timed
    there, the baseline."""
    gpu = FakeCuda(monkeypatch)
    started = [0.0]
    order: list[tuple[int, int, float]] = []  # (key n, block, warm_ms) per timing
    make = fakeops.FakeSpec.make_inputs
    heuristic = fakeops.FakeSpec.heuristic

    def make_inputs(self, key, device, seed):
        started[0] = gpu.now_ms  # a key's inputs are made: the GPU is cold again
        return make(self, key, device, seed)

    twin = ramp(started)

    def on_fake_gpu(fns, tdev, **kw):  # the candidate's timing, on the fake GPU
        order.append((*current, kw["warm_ms"]))
        return time_call(gpu.kernel(twin), "cuda", **kw)

    current: list[int] = []
    timed = measure._timed

    def remember(spec, config, sets, *a, **k):  # which key and candidate is timed
        current[:] = [sets[0]["x"].numel(), config.block]
        return timed(spec, config, sets, *a, **k)

    monkeypatch.setattr(fakeops.FakeSpec, "make_inputs", make_inputs)
    monkeypatch.setattr(fakeops.FakeSpec, "heuristic", lambda self, key: fakeops.FakeConfig(
        block=fakeops.WRONG) if key.n == 256 else heuristic(self, key))
    monkeypatch.setattr(measure, "time_call", on_fake_gpu)
    monkeypatch.setattr(measure, "_timed", remember)
    if warm_up == "none":
        monkeypatch.setattr(measure, "KEY_WARMUP_MS", 0.0)
    elif warm_up == "one fixed batch":
        monkeypatch.setattr(timing, "warm_until_steady", one_fixed_batch)
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    sweep.tune(targets, device=dev, torch_device=tdev, store=store, reps=5)

    warm_ms = 0.0 if warm_up == "none" else KEY_WARMUP_MS
    firsts = {}
    for n, block, got in order:
        firsts.setdefault(n, block)
        assert got == (warm_ms if firsts[n] == block else 0.0)
    assert firsts == {64: 16, 256: 1, 1024: 16}
    assert len(order) == 3 * 5  # each key's servable blocks 1, 2, 4, 16, 32
    us = {(json.loads(m.key_json)["n"], json.loads(m.config_json)["block"]): m.median_us
          for m in store.measurements(op="tune_fake") if m.status == "ok"}
    assert len(us) == len(order)
    for (n, block), median in us.items():
        if warm_up == "adaptive":
            assert median == pytest.approx(US), (n, block)
        elif firsts[n] == block:
            assert median > US * (1 + RAMP / 2), (n, block)
