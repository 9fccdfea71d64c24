"""The order a sweep takes its keys in, and its database reads per key.

Workers sharing a key list claim first the keys they described ahead themselves
(:func:`kdispatch.tuning.ahead.turns`), so a key's inputs are made by the worker that times
it; the "already measured" check is one query per key, at the key's start."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import fakeops
from kdispatch.store import MeasurementIn
from kdispatch.tuning import sweep
from kdispatch.tuning.ahead import turns
from kdispatch.tuning.jobs import claimer

N_KEYS, N_CANDS = 3, len(fakeops.BLOCKS)


class _Ahead:
    """What :func:`turns` asks of a CompileAhead: the keys this worker described ahead."""

    def __init__(self, described=()):
        self.mine = set(described)
        self.forgotten: list[int] = []

    def described(self, i: int) -> bool:
        return i in self.mine

    def forget(self, i: int) -> None:
        self.forgotten.append(i)
        self.mine.discard(i)


def test_without_claims_every_key_comes_in_order():
    assert list(turns(4, None, _Ahead({3}))) == [0, 1, 2, 3]


def test_a_worker_claims_the_keys_it_described_first_then_the_rest_in_order():
    claims = mp.get_context("spawn").Array("b", 6)
    mine, other = claimer(claims), claimer(claims)
    ahead = _Ahead({2, 4})
    got = turns(6, mine, ahead)
    assert next(got) == 2
    assert other(4)  # the other worker took a key this one described: it is dropped here
    assert next(got) == 0  # then the first unclaimed key, in order
    assert other(1)
    assert list(got) == [3, 5]
    assert ahead.forgotten == [4, 1]


def test_a_worker_is_never_idle_while_a_key_is_unclaimed():
    claims = mp.get_context("spawn").Array("b", 5)
    a, b = claimer(claims), claimer(claims)
    ahead_a, ahead_b = _Ahead({1, 3}), _Ahead({0, 2, 4})
    ta, tb = turns(5, a, ahead_a), turns(5, b, ahead_b)
    assert [next(tb), next(tb)] == [0, 2]
    assert [next(ta), next(ta), next(ta)] == [1, 3, 4]  # then b's last key
    assert list(tb) == [] and list(ta) == []
    assert sorted(ahead_b.forgotten) == [1, 3, 4]


@pytest.fixture
def fake_op():
    fakeops.install()
    yield fakeops.SPEC
    fakeops.uninstall()


def test_one_already_measured_query_per_key_and_rows_from_another_tuner_are_not_timed(
        store, fake_op, monkeypatch):
    """A row another tuner committed after the plan, before the key's turn, is not measured
    again (its candidate never runs); the database is asked once per key, not per
    candidate."""
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    assert len(targets) == N_KEYS
    later = targets[1]
    queries, ran = [], []
    real_query = store.measured_configs
    monkeypatch.setattr(store, "measured_configs",
                        lambda *a: queries.append(a) or real_query(*a))
    real_run = type(fake_op).run
    monkeypatch.setattr(type(fake_op), "run", lambda self, cfg, inp: ran.append(
        (inp["x"].numel(), cfg.block)) or real_run(self, cfg, inp))

    cfg = fake_op.parse_config({"block": 2}).model_dump(mode="json")

    def progress(p):
        if p.key_index == 0 and p.done == 0:  # the first key starts: another tuner commits
            store.record(MeasurementIn(op="tune_fake", key=later.key, config=cfg,
                                       source_hash=fake_op.source_hash(), status="ok",
                                       verified=True, median_us=1.0))

    res = sweep.tune(targets, device=dev, torch_device=tdev, store=store, progress=progress)
    assert len(queries) == 2 * N_KEYS  # the plan's, then one at each key's start
    assert res.skipped == 1 and res.measured == N_KEYS * N_CANDS - 1
    n = fake_op.parse_key(later.key).n
    assert (n, 2) not in ran and (n, 4) in ran


def test_a_worker_does_not_summarize(store, fake_op):
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    res = sweep.tune(targets, device=dev, torch_device=tdev, store=store, summary=False)
    assert res.summaries == [] and res.measured == N_KEYS * N_CANDS
