"""Early rejection: a verified candidate clearly slower than its key's best full measurement
is timed by a short pilot only; whatever can win, and the heuristic, gets the full protocol;
a wrong candidate is still rejected before any timing."""

from __future__ import annotations

import json
import math
import time
from collections import Counter

import pytest

import fakeops
from fakecuda import FakeCuda
from kdispatch.tuning import sweep
from kdispatch.tuning.measure import PILOT_NOTE, PILOT_RATIO, RETIMED_NOTE, KeyBest
from kdispatch.tuning.timing import PILOT_REPS, Timing, staged, time_call

REPS = 8  # full samples per candidate (> PILOT_REPS, so a pilot is shorter than a full run)
#: seconds per call by block, in candidate order: heuristic 16, then 1, 2, 4, 8 (wrong),
#: 32, 64 (infeasible). 1 is 5x the heuristic; 2 ties it; 4 is twice as fast (the new best);
#: 32 is then 4x the best.
SLEEP = {16: 0.02, 1: 0.1, 2: 0.02, 4: 0.01, 32: 0.04}


@pytest.fixture(autouse=True)
def fake_op():
    fakeops.install()
    yield fakeops.SPEC
    fakeops.uninstall()


def test_staged_stops_after_the_pilot_only_above_the_threshold():
    taken = []

    def take(k):
        taken.append(k)
        return [100.0] * k
    assert staged(take, 40, 2, 40.0) == ([100.0] * PILOT_REPS, True)  # 50 us/call > 40
    assert taken == [PILOT_REPS]
    taken.clear()
    samples, pilot = staged(take, 40, 2, 60.0)
    assert (len(samples), pilot, taken) == (40, False, [PILOT_REPS, 40 - PILOT_REPS])
    taken.clear()
    assert staged(take, 40, 1, None) == ([100.0] * 40, False) and taken == [40]
    assert staged(take, 3, 1, 1.0) == ([100.0] * 3, False)  # a pilot as long as the run


def test_time_call_pilot_on_cpu():
    slow = time_call(lambda: time.sleep(0.005), "cpu", reps=REPS, stop_above_us=1000.0)
    assert slow.pilot and slow.reps == PILOT_REPS and slow.median_us > 1000
    close = time_call(lambda: time.sleep(0.005), "cpu", reps=REPS, stop_above_us=50000.0)
    assert not close.pilot and close.reps == REPS


def test_key_best_counts_full_servable_measurements_only():
    full = Timing(10.0, 9.0, 11.0, REPS)
    best = KeyBest()
    assert best.stop_above("candidate") is None  # nothing to compare with yet
    best.update("baseline", Timing(1.0, 1.0, 1.0, REPS))  # never chosen: sets no bar
    best.update("candidate", Timing(2.0, 2.0, 2.0, PILOT_REPS, pilot=True))
    assert best.us is None
    best.update("candidate", full)
    assert best.stop_above("candidate") == pytest.approx(PILOT_RATIO * 10.0)
    assert best.stop_above("heuristic") is None


def test_slow_candidates_stop_after_the_pilot_and_the_best_is_timed_in_full(store,
                                                                          monkeypatch):
    runs = Counter()
    orig = fakeops.FakeSpec.launch

    def launch(self, config, x):
        runs[config.block] += 1
        time.sleep(SLEEP.get(config.block, 0.0))
        return orig(self, config, x)
    monkeypatch.setattr(fakeops.FakeSpec, "launch", launch)
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    res = sweep.tune(targets[:1], device=dev, torch_device=tdev, store=store, reps=REPS)
    rows = {json.loads(m.config_json)["block"]: m for m in store.measurements()}
    assert set(rows) == set(fakeops.BLOCKS)
    pilot = {b for b, m in rows.items() if m.error and m.error.startswith(PILOT_NOTE)}
    assert pilot == {1, 32}
    for b in pilot:  # measured, verified, with the pilot's times
        assert rows[b].status == "ok" and rows[b].verified and rows[b].median_us > 0
        assert "x the key's best full measurement" in rows[b].error
    full = 1 + 1 + REPS  # verified, one warm-up round, every sample
    assert runs[2] == runs[4] == full  # a tie, the new best
    # the heuristic, the key's first timed candidate, in full twice (again at the key's end)
    assert runs[16] == 2 * full and rows[16].error.startswith(RETIMED_NOTE)
    assert runs[1] == runs[32] == 1 + 1 + PILOT_REPS
    # the wrong candidate ran once, to be verified, and was never timed
    assert runs[fakeops.WRONG] == 1 and rows[fakeops.WRONG].status == "rejected"
    assert rows[fakeops.WRONG].median_us is None
    best = store.best(op="tune_fake")
    assert [b.config["block"] for b in best] == [4] and rows[4].error is None
    assert res.summaries[0].best_config["block"] == 4
    assert res.throughput.pilot_only == 2
    assert "2 timed by their pilot only" in res.throughput.line()


@pytest.mark.parametrize("us,stop,pilot", [(45.0, 40.0, True), (45.0, 60.0, False),
                                           (45.0, None, False), (4000.0, 1000.0, True)])
def test_graph_timing_pilot_on_a_simulated_gpu(monkeypatch, us, stop, pilot):
    from kdispatch.tuning.timing import GRAPH_TARGET_US, MIN_REPS, TARGET_TOTAL_MS

    gpu = FakeCuda(monkeypatch)
    t = time_call(gpu.kernel(us), "cuda", warmup=1, stop_above_us=stop)
    calls = math.ceil(GRAPH_TARGET_US / us)  # 5 calls of 45 us, 1 of 4 ms
    full = max(MIN_REPS, int(TARGET_TOTAL_MS * 1000 / (calls * us)))
    assert (t.method, t.calls_per_sample, t.pilot) == ("cuda-graph", calls, pilot)
    assert t.median_us == pytest.approx(us)
    assert t.reps == (PILOT_REPS if pilot else full)
    # a warm-up and a sizing replay after the capture, then the samples
    assert gpu.replays == 2 + t.reps
    assert gpu.calls == 1 + calls * gpu.replays  # one eager (timed) warm-up call
