"""Compiling overlaps timing: keys are described for the pool as the timing goes, a
candidate waits for its own kernels only, and the pool compiles later keys meanwhile.

The fake op of ``fakecompile.KeyedSpec`` has kernels of each key's own (one per key and
block) and inputs that take ``KD_FAKE_INPUTS_SLEEP`` seconds to make; the fake compiler
records when each kernel compiled and the op when each candidate ran (``time.time()``,
comparable across the pool's processes and the workers)."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections import Counter

import pytest
import torch

import fakecompile
import fakeops
from kdispatch.device import Device
from kdispatch.registry import get_op
from kdispatch.store import Store, digest
from kdispatch.tuning import parallel, sweep
from kdispatch.tuning.ahead import CompileAhead
from kdispatch.tuning.compile_pool import CompilePool
from kdispatch.tuning.plan import candidate_list
from kdispatch.tuning.precompile import Outcome
from kdispatch.tuning.jobs import FED, DeviceGroup, GroupRun

KEYS_N = (64, 256, 1024)  # the fake preset's keys, in the order they are timed
N_CANDS = len(fakeops.BLOCKS)
REJECTED = 4
REJECTION = "CompilationError: at 3:4: fake rejection"


@pytest.fixture(autouse=True)
def keyed_op():
    fakecompile.install(keyed=True)
    yield
    fakeops.uninstall()


@pytest.fixture
def logs(tmp_path, monkeypatch):
    compiles, runs = tmp_path / "compiles.log", tmp_path / "runs.log"
    monkeypatch.setenv("KD_FAKE_COMPILE_TIMES", str(compiles))
    monkeypatch.setenv("KD_FAKE_RUN_TIMES", str(runs))
    monkeypatch.setenv("KD_FAKE_COMPILE_FAIL", str(REJECTED))
    return compiles, runs


def _compiles(path) -> dict[tuple[int, int], tuple[float, float]]:
    """(n, block) -> (start, end) of its compile; each kernel compiled once."""
    rows = [line.split() for line in path.read_text().splitlines()]
    seen = Counter((int(n), int(b)) for b, n, _, _ in rows)
    assert max(seen.values()) == 1, seen.most_common(3)
    return {(int(n), int(b)): (float(s), float(e)) for b, n, s, e in rows}


def _runs(path) -> list[tuple[float, int, int]]:
    return [(float(t), int(n), int(b))
            for t, n, b in (line.split() for line in path.read_text().splitlines())]


def _rows(store):
    return Counter((json.loads(m.key_json)["n"], json.loads(m.config_json)["block"],
                    m.status, m.error) for m in store.measurements(op="tune_fake"))


def _check_rows_and_order(store, compiles, runs):
    """Every (key, block) once, the rejected block infeasible and never run, and every
    candidate run after its own kernel was compiled."""
    rows = _rows(store)
    assert sum(rows.values()) == len(KEYS_N) * N_CANDS and max(rows.values()) == 1
    assert {(n, b) for n, b, _, _ in rows} == {(n, b) for n in KEYS_N for b in fakeops.BLOCKS}
    for n, b, status, error in rows:
        if b == REJECTED:
            assert (status, error) == ("infeasible", REJECTION)
        else:
            assert status != "infeasible" or b == fakeops.INFEASIBLE
    assert set(compiles) == {(n, b) for n in KEYS_N for b in fakeops.BLOCKS}
    assert runs and all(b != REJECTED for _, _, b in runs)
    for t, n, b in runs:
        assert compiles[n, b][1] <= t, f"key {n} block {b} ran before its kernel compiled"


def test_the_first_key_is_timed_while_later_keys_still_compile(store, logs, monkeypatch):
    """Making a key's inputs takes 1 s and compiling a kernel 0.2 s: a sweep that described
    every key before timing any would start timing ~3 s in, once the last key's kernels
    were already queued; here the first key is timed before the last key is described."""
    monkeypatch.setenv("KD_FAKE_INPUTS_SLEEP", "1.0")
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "0.2")
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    assert [t.key["n"] for t in targets] == list(KEYS_N)
    phases = []
    fakecompile.MADE.clear()
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        t0 = time.monotonic()
        while not all(p.ready for p in pool._procs):  # started: only the sweep is timed
            assert time.monotonic() - t0 < 60, "the pool did not start"
            time.sleep(0.02)
        res = sweep.tune(targets, device=dev, torch_device=tdev, store=store,
                         precompile=pool, target=fakecompile.TARGET,
                         progress=lambda p: phases.append((p.key_index, p.phase)))
    compiles, runs = _compiles(logs[0]), _runs(logs[1])
    _check_rows_and_order(store, compiles, runs)
    first_run = min(t for t, _, _ in runs)
    last_key = [v for (n, _), v in compiles.items() if n == KEYS_N[-1]]
    assert first_run < max(e for _, e in last_key)  # timing overlaps compiling...
    assert first_run < min(s for s, _ in last_key) - 0.3  # ...of keys not even queued yet
    # the keys were timed in order, each once
    timed = [n for _, n, _ in sorted(runs)]
    assert sorted(set(timed), key=timed.index) == list(KEYS_N)
    thr = res.throughput
    assert res.measured == len(KEYS_N) * N_CANDS and thr.pool["failed"] == len(KEYS_N)
    assert fakecompile.MADE == list(KEYS_N)  # each key's inputs made once, in order
    assert thr.describe_s >= 3.0 and thr.jit_compiled == 0
    assert (0, "compiling") in phases  # the progress says what the first key waits for


def test_a_key_that_cannot_be_described_ahead_is_described_at_its_turn(store, logs,
                                                                       monkeypatch):
    """No device memory for the next key's inputs beside the current key's: that key is
    described when its turn comes, and its candidates still wait for their own kernels.

    The pool has a process more than a key has kernels, so it asks for the later keys
    before the first key's candidates run (a busier pool would be fed them only as it
    drains, maybe not before their turn, where inputs that cannot be made leave the key
    to the JIT)."""
    monkeypatch.setenv("KD_FAKE_INPUTS_SLEEP", "0.3")
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "0.1")
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    fakecompile.MADE.clear()
    fakecompile.OOM_ONCE.update(KEYS_N[1:])
    with CompilePool(N_CANDS + 1, compiler=fakecompile.COMPILER) as pool:
        sweep.tune(targets, device=dev, torch_device=tdev, store=store, precompile=pool,
                   target=fakecompile.TARGET)
    assert not fakecompile.OOM_ONCE  # both were tried ahead first
    assert fakecompile.MADE == list(KEYS_N)
    _check_rows_and_order(store, _compiles(logs[0]), _runs(logs[1]))


def test_two_workers_feed_one_pool_once_and_lose_or_repeat_no_rows(tmp_path, logs,
                                                                   monkeypatch):
    monkeypatch.setenv("KD_FAKE_INPUTS_SLEEP", "0.3")
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "0.1")
    store = Store(f"sqlite:///{tmp_path / 'two.sqlite'}")
    dev = Device.interpreter()
    targets, _ = sweep.plan(dev, ["fake"])
    try:
        results = parallel.tune_local([GroupRun(DeviceGroup(dev, ("cpu", "cpu")), targets)],
                                      store, compile_settings=fakecompile.SETTINGS)
        assert all(r.ok for r in results), [r.error for r in results]
        compiles, runs = _compiles(logs[0]), _runs(logs[1])  # each kernel compiled once
        _check_rows_and_order(store, compiles, runs)
        assert sum(r.counts["keys"] for r in results) == len(KEYS_N)
        assert sum(r.counts["throughput"]["jit_compiled"] for r in results) == 0
    finally:
        store.dispose()


def test_the_claim_register_feeds_each_key_once_and_never_one_claimed_for_timing():
    claims = mp.get_context("spawn").Array("b", 3)
    claim_a, claim_b = parallel.claimer(claims), parallel.claimer(claims)
    feed_a, feed_b = parallel.claimer(claims, FED), parallel.claimer(claims, FED)
    assert [feed_a(0), feed_b(0), feed_b(1)] == [True, False, True]
    # feeding a key ahead does not claim it: either worker may still time it
    assert [claim_b(0), claim_a(0), claim_a(1)] == [True, False, True]
    # a key claimed for timing is described by its worker, never fed by another
    assert [claim_a(2), feed_b(2), feed_a(2)] == [True, False, False]


def test_a_keys_reference_is_computed_while_its_kernels_compile(store, logs, monkeypatch):
    """The key's inputs and reference are made before its first candidate waits for its
    kernels, not after: the reference of the first key is done before any of its kernels
    compiled (each takes 0.5 s here)."""
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "0.5")
    refs: dict[int, float] = {}
    real = fakecompile.KeyedSpec.reference
    monkeypatch.setattr(fakecompile.KeyedSpec, "reference", lambda self, inputs: refs.setdefault(
        inputs["x"].numel(), time.time()) and real(self, inputs))
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        t0 = time.monotonic()
        while not all(p.ready for p in pool._procs):
            assert time.monotonic() - t0 < 60, "the pool did not start"
            time.sleep(0.02)
        sweep.tune(targets, device=dev, torch_device=tdev, store=store, precompile=pool,
                   target=fakecompile.TARGET)
    compiles = _compiles(logs[0])
    _check_rows_and_order(store, compiles, _runs(logs[1]))
    first = KEYS_N[0]
    assert refs[first] < min(e for (n, _), (_, e) in compiles.items() if n == first)


# -- what a candidate's wait describes ------------------------------------------------------------
class _Pool:
    """A pool of ``workers`` processes, without processes: every kernel submitted is done
    once ``polls`` waits with a timeout have passed (0: at once)."""

    def __init__(self, workers, polls=0):
        self.workers, self.polls = workers, polls
        self.items = {}

    def submit(self, items):
        self.items.update(items)

    def prioritize(self, ids):
        pass

    def wait(self, ids, timeout=None):
        if timeout and self.polls:
            self.polls -= 1
        if self.polls:
            return {}
        return {v: Outcome("compiled") for v in ids if v in self.items}

    def stats(self):
        return None


def _first_turn(pool):
    """The fake preset's keys planned for ``pool``, key 0 described at its turn; the
    compile-ahead side and key 0's first candidate's digest."""
    dev, _ = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    work = []
    for ki, t in enumerate(targets):
        op = get_op(t.op)
        key = op.parse_key(t.key)
        work.append((ki, op, key, [(digest(c.model_dump(mode="json")), c)
                                   for c, _ in candidate_list(op, key)]))
    ahead = CompileAhead(pool, fakecompile.TARGET, torch.device("cpu"), workers=pool.workers)
    ahead.plan(work)
    fakecompile.MADE.clear()
    ahead.own(0)
    assert fakecompile.MADE == [KEYS_N[0]] and len(pool.items) == N_CANDS
    return ahead, work[0][3][0][0]


def test_a_candidate_whose_kernels_are_done_starts_without_describing_a_later_key():
    ahead, first = _first_turn(_Pool(workers=4 * N_CANDS))  # a pool that would run dry
    assert ahead.ready(0, first).status == "go"
    assert fakecompile.MADE == [KEYS_N[0]]


def test_a_wait_describes_no_later_key_while_the_pool_is_busy():
    """Key 0's 7 kernels keep a pool of 2 processes busy: the wait describes nothing (a
    describe would only start the candidate late)."""
    pool = _Pool(workers=2, polls=3)
    ahead, first = _first_turn(pool)
    assert ahead.ready(0, first).status == "go" and pool.polls == 0
    assert fakecompile.MADE == [KEYS_N[0]] and len(pool.items) == N_CANDS


def test_a_wait_describes_a_later_key_when_the_pool_would_run_dry():
    """A pool of 8 processes with key 0's 7 kernels would run dry: the wait describes key 1,
    whose kernels keep it busy, and no more."""
    pool = _Pool(workers=N_CANDS + 1, polls=1)
    ahead, first = _first_turn(pool)
    assert ahead.ready(0, first).status == "go"
    assert fakecompile.MADE == list(KEYS_N[:2]) and len(pool.items) == 2 * N_CANDS
