"""A key's inputs and reference are made once and shared by its candidates, and a candidate
never sees what an earlier one wrote into them."""

from __future__ import annotations

import json

import pytest
import torch

import fakecompile
import fakeops
from kdispatch.registry import get_op
from kdispatch.tuning import inputs as inputs_mod
from kdispatch.tuning import sweep
from kdispatch.tuning.ahead import KEEP_MIN_S, CompileAhead
from kdispatch.tuning.compile_pool import CompilePool
from kdispatch.tuning.inputs import KeyInputs, copy_inputs

N_CANDS = len(fakeops.BLOCKS)
LAZY = 2  # a config that returns its output buffer without writing it


@pytest.fixture(autouse=True)
def fake_op():
    fakecompile.install()
    yield get_op("tune_fake")
    fakeops.uninstall()


@pytest.fixture
def calls(monkeypatch):
    """Counts of make_inputs and reference calls of the fake op."""
    seen = {"make_inputs": 0, "reference": 0}
    for name in seen:
        orig = getattr(fakeops.FakeSpec, name)

        def counted(self, *a, _orig=orig, _name=name, **kw):
            seen[_name] += 1
            return _orig(self, *a, **kw)
        monkeypatch.setattr(fakeops.FakeSpec, name, counted)
    return seen


def _tune(store, n_keys=None, pool=None, **kw):
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    return sweep.tune(targets[:n_keys], device=dev, torch_device=tdev, store=store,
                      precompile=pool, target=fakecompile.TARGET if pool else None, **kw)


def _by_block(store):
    return {json.loads(m.config_json)["block"]: m for m in store.measurements(op="tune_fake")}


def test_inputs_and_reference_are_made_once_per_key(store, calls):
    res = _tune(store)
    n_keys = len(res.summaries)
    assert res.measured == n_keys * N_CANDS
    # before: once for the reference, then once more per candidate that ran
    assert calls == {"make_inputs": n_keys, "reference": n_keys}
    assert {m.status for m in store.measurements()} == {"ok", "rejected", "infeasible"}


def test_a_candidate_that_trashes_its_inputs_does_not_fail_the_next(store, monkeypatch):
    orig = fakeops.FakeSpec.run

    def run(self, config, inputs):
        out = orig(self, config, inputs)
        if config.block == 16:  # right output, then garbage in its inputs
            inputs["x"].mul_(-3.0)
        return out
    monkeypatch.setattr(fakeops.FakeSpec, "run", run)
    _tune(store, n_keys=1)
    rows = _by_block(store)
    assert rows[16].status == "ok"  # verified before it wrote: timing runs write on
    ok = {b for b, m in rows.items() if m.status == "ok"}
    assert ok == set(fakeops.BLOCKS) - {fakeops.WRONG, fakeops.INFEASIBLE}


def test_a_candidate_that_skips_its_write_is_rejected_after_a_right_one(store, monkeypatch):
    """Like a KV write: the output lives in the inputs. A config that writes nothing must
    not pass on what the candidate before it wrote there."""
    orig_make = fakeops.FakeSpec.make_inputs

    def make_inputs(self, key, device, seed):
        inputs = orig_make(self, key, device, seed)
        g = torch.Generator().manual_seed(seed + 1)
        inputs["out"] = torch.rand(key.n, generator=g).to(device)
        return inputs

    def run(self, config, inputs):
        if config.block == fakeops.INFEASIBLE:
            return self.launch(config, inputs["x"])
        if config.block != LAZY:
            inputs["out"].copy_(inputs["x"] * 2)
        return inputs["out"]

    monkeypatch.setattr(fakeops.FakeSpec, "make_inputs", make_inputs)
    monkeypatch.setattr(fakeops.FakeSpec, "run", run)
    _tune(store, n_keys=1)
    rows = _by_block(store)
    key = get_op("tune_fake").parse_key(json.loads(rows[16].key_json))
    order = [c.block for c, _ in sweep.candidate_list(get_op("tune_fake"), key)]
    assert order[:3] == [16, 1, LAZY]  # two right ones wrote before it ran
    assert rows[LAZY].status == "rejected" and rows[LAZY].median_us is None
    assert rows[1].status == rows[16].status == "ok"


def test_copy_keeps_views_and_resets_with_one_copy_per_storage():
    base = torch.arange(12.0)
    inputs = {"a": base[2:8].view(2, 3), "b": base[::4], "s": 0.5, "none": None}
    work, pairs = copy_inputs(inputs)
    assert len(pairs) == 1 and work["s"] == 0.5 and work["none"] is None
    assert work["a"].untyped_storage().data_ptr() == work["b"].untyped_storage().data_ptr()
    assert work["a"].data_ptr() != inputs["a"].data_ptr()
    assert torch.equal(work["a"], inputs["a"]) and torch.equal(work["b"], inputs["b"])
    work["a"].fill_(-1.0)
    assert work["b"].tolist() == [0.0, -1.0, 8.0]  # still a view of the same copy
    for dst, src in pairs:
        dst.copy_(src)
    assert torch.equal(work["b"], inputs["b"]) and torch.equal(base, torch.arange(12.0))


def test_inputs_that_do_not_fit_twice_are_made_again_per_candidate(fake_op, calls,
                                                                   monkeypatch):
    def oom(inputs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(inputs_mod, "copy_inputs", oom)
    dev, tdev = sweep.resolve_device("cpu")
    key = fake_op.key(dev, {"n": 64})
    kin = KeyInputs(fake_op, key, tdev, 0)
    assert not kin.shared and calls == {"make_inputs": 1, "reference": 1}
    a, b = kin.for_candidate(), kin.for_candidate()
    assert calls["make_inputs"] == 3 and torch.equal(a["x"], b["x"]) and a["x"] is not b["x"]
    assert torch.equal(kin.reference, a["x"] * 2)


def test_slow_inputs_made_to_describe_launches_are_kept_for_the_sweep(store, calls,
                                                                      monkeypatch):
    import time as time_mod
    orig = fakeops.FakeSpec.make_inputs

    def slow(self, key, device, seed):
        time_mod.sleep(KEEP_MIN_S)  # as a host-drawn KV-write input of 16k tokens
        return orig(self, key, device, seed)
    monkeypatch.setattr(fakeops.FakeSpec, "make_inputs", slow)
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        res = _tune(store, pool=pool)
    n_keys = len(res.summaries)
    assert res.measured == n_keys * N_CANDS
    assert calls == {"make_inputs": n_keys, "reference": n_keys}  # before: 2 per key at least

    ahead = CompileAhead(None, None, "cpu")
    ahead._keep(0, {"x": torch.ones(4)}, KEEP_MIN_S)
    ahead._keep(1, {"x": torch.ones(4)}, KEEP_MIN_S / 10)  # quick to make again: not kept
    assert ahead.take_inputs(1) is None and ahead.take_inputs(0) is not None
    assert ahead.take_inputs(0) is None and ahead._kept_bytes == 0
